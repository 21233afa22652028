package redisstore

import "github.com/floodgate/floodgate/internal/lib/redisacl"

// ACLCommands are the ACL rules for the commands the store sends and its
// scripts call, starting from none (-@all). FUNCTION LOAD and FCALL are
// optional (without them the store uses EVALSHA), and CONFIG GET and INFO
// serve only floodgate serve's monitor. CI runs the Redis tests as a user
// with exactly these rules, so a new command cannot slip in unnoticed.
const ACLCommands = redisacl.Commands

// ACLRules returns the whole ACL for a store whose keys start with prefix
// (Options.Prefix, "floodgate:" when empty): its keys, the denial cache's
// and leases' acknowledgement lists (floodgate:lifts:ack:*) and channel
// (floodgate:lifts), and ACLCommands, as arguments to ACL SETUSER after
// the user's name and password, e.g.
//
//	ACL SETUSER limiter on >secret resetkeys ~floodgate:* ~floodgate:lifts:ack:* resetchannels &floodgate:lifts -@all +hello ...
func ACLRules(prefix string) string {
	if prefix == "" {
		prefix = "floodgate:"
	}
	return redisacl.Rules(prefix)
}
