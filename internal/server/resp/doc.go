// Package resp serves floodgate over the Redis protocol (RESP2, and RESP3
// after HELLO 3), so that any Redis client can call it:
//
//	CL.THROTTLE <key> <max_burst> <count> <period_seconds> [<quantity>]
//	    redis-cell's command, with exactly its reply: limited (0/1), limit,
//	    remaining, retry_after and reset_after in seconds (rounded up;
//	    retry_after -1 when allowed or never allowable).
//	FG.CHECK <rule> <key> [<cost>]
//	    a configured rule: limited (0/1; always 0 for a shadow rule),
//	    limit, remaining, retry_after_ms (-1 when allowed or never),
//	    reset_after_ms.
//	FG.SETTLE <rule> <key> <charged> <cost>
//	    corrects a check that charged charged to the real cost: refunds or
//	    charges the difference (even into debt); replies as FG.CHECK, with
//	    the state after.
//	FG.OVERRIDE SET <rule> <key> <override> | GET <rule> <key> |
//	    DEL <rule> <key> [<strategy>] | LIST [<rule>]
//	    a key's own limits (see override's documentation)
//	FG.EXPLAIN <rule> <key> [JSON]
//	    why a check of the key is decided as it is now, charging nothing:
//	    the explanation's sentences, or with JSON, GET /v1/explain's body.
//	FG.RESET <rule> <key>, FG.RULES
//	PING, ECHO, HELLO, AUTH, QUIT, SELECT 0, COMMAND, CLIENT
//
// Frames are bounded (MaxArgs arguments, MaxBulk bytes each, MaxInline
// bytes for an inline command). A malformed frame gets a RESP error and
// the connection is closed; other connections are unaffected.
//
// Abusive clients: with a token, a connection that has not authenticated
// is closed after AuthTimeout of silence, after MaxAuthFailures wrong
// passwords, or to make room when MaxUnauthenticated connections wait to
// authenticate (the oldest goes), so connections that never authenticate
// cannot take the slots of those that do. Wrong passwords are counted in
// floodgate_resp_auth_failures_total and logged at most once a second.
// Every write has a deadline, and every command runs on a context that
// ends when the server stops.
package resp
