// Package redisacl holds the Redis ACL floodgate needs, in one place:
// redisstore exports it (redisstore.ACLCommands, redisstore.ACLRules) and
// internal/redistest creates a user with it, so CI runs the Redis suites
// under exactly the documented ACL. It is a leaf package because
// redistest cannot import redisstore (redisstore's own tests import
// redistest).
package redisacl

// Commands are the commands floodgate's Redis store sends or its scripts
// call, as ACL rules that start from none (-@all):
//   - the connection: hello, auth, ping, select (a URL's /db); go-redis's
//     CLIENT SETINFO may be refused (it ignores the refusal, and Redis 7.0
//     has no such command for an ACL to name);
//   - the scripts: evalsha and eval (EVALSHA, EVAL after NOSCRIPT), fcall
//     and function|load (Redis 7 functions, optional: without them the
//     store uses EVALSHA);
//   - the client's own: get, set, del, scan (overrides, rebase), time (a
//     rebase's now), and with the denial cache or leases publish,
//     subscribe, blpop, rpush, expire;
//   - a Cluster client's routing: cluster|slots, asking (an ASK redirection while a slot migrates), and command (go-redis's
//     ClusterClient reads COMMAND to route; refused, it logs at every
//     call);
//   - the monitor of floodgate serve (optional): config|get, info;
//   - what the Lua scripts call: time, get, mget, set, setrange, pexpire,
//     del, exists, and the sorted-set commands of the sliding log.
const Commands = "-@all" +
	" +hello +auth +ping +select" +
	" +evalsha +eval +fcall +function|load" +
	" +get +set +del +scan +time" +
	" +publish +subscribe +blpop +rpush +expire" +
	" +cluster|slots +asking +command" +
	" +config|get +info" +
	" +mget +setrange +pexpire +exists" +
	" +zadd +zcard +zcount +zrange +zrem +zremrangebyrank +zremrangebyscore"

// LiftsChannel is the channel on which stores publish lifted denials.
const LiftsChannel = "floodgate:lifts"

// LiftsAckKeys is the key pattern of the lists that acknowledge a lift.
const LiftsAckKeys = "floodgate:lifts:ack:*"

// Rules returns the full ACL rules for a store whose keys start with
// prefix: its keys, the lifts' acknowledgements and channel, and Commands.
// A prefix holding a glob character (*?[\) is escaped so the rule matches
// only that prefix.
func Rules(prefix string) string {
	return "resetkeys ~" + escapeGlob(prefix) + "* ~" + LiftsAckKeys +
		" resetchannels &" + LiftsChannel + " " + Commands
}

func escapeGlob(s string) string {
	out := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '*', '?', '[', ']', '\\':
			out = append(out, '\\')
		}
		out = append(out, s[i])
	}
	return string(out)
}
