package resp

// AUTH and HELLO: a connection's password and protocol version.

import (
	"crypto/subtle"
	"strings"
)

func (c *conn) checkAuth(user, pass string) bool {
	if c.s.token == "" {
		return true
	}
	_ = user // any user name: the token is the secret
	return subtle.ConstantTimeCompare([]byte(pass), []byte(c.s.token)) == 1
}

func (c *conn) auth(args []string) {
	var user, pass string
	switch len(args) {
	case 2:
		user, pass = "default", args[1]
	case 3:
		user, pass = args[1], args[2]
	default:
		c.writeError(errArgs("auth"))
		return
	}
	if c.s.token == "" {
		c.writeError("ERR AUTH called without any password configured for the default user. Are you sure your configuration is correct?")
		return
	}
	if !c.checkAuth(user, pass) {
		c.wrongPassword()
		return
	}
	c.setAuthed()
	c.writeSimple("OK")
}

// setAuthed records a successful authentication.
func (c *conn) setAuthed() {
	if !c.authed {
		c.authed = true
		c.s.authenticated(c)
	}
}

// wrongPassword answers a wrong password, counts it, and logs it at most
// once a second with the number of failures since the last line.
func (c *conn) wrongPassword() {
	c.failures++
	c.writeError("WRONGPASS invalid username-password pair or user is disabled.")
	s := c.s
	s.authFailures.Add(1)
	if held, ok := s.authLog.Allow(); ok {
		s.log.Warn("floodgate: wrong passwords on the Redis protocol", "failures", held+1, "last_from", c.c.RemoteAddr().String())
	}
}

func (c *conn) hello(args []string) {
	proto := c.proto
	if len(args) > 1 {
		v, ok := parseInt(args[1])
		if !ok {
			c.writeError("ERR Protocol version is not an integer or out of range")
			return
		}
		if v != 2 && v != 3 {
			c.writeError("NOPROTO unsupported protocol version")
			return
		}
		proto = int(v)
		for i := 2; i < len(args); i++ {
			switch strings.ToUpper(args[i]) {
			case "AUTH":
				if i+2 >= len(args) {
					c.writeError("ERR Syntax error in HELLO option 'auth'")
					return
				}
				if c.s.token != "" && !c.checkAuth(args[i+1], args[i+2]) {
					c.wrongPassword()
					return
				}
				c.setAuthed()
				i += 2
			case "SETNAME":
				if i+1 >= len(args) {
					c.writeError("ERR Syntax error in HELLO option 'setname'")
					return
				}
				i++
			default:
				c.writeError("ERR Syntax error in HELLO option '" + printable([]byte(args[i])) + "'")
				return
			}
		}
	}
	if !c.authed {
		c.writeError("NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol version at the same time")
		return
	}
	c.proto = proto
	c.writeMapHeader(7)
	c.writeBulk("server")
	c.writeBulk("floodgate")
	c.writeBulk("version")
	c.writeBulk(c.s.version)
	c.writeBulk("proto")
	c.writeInt(int64(c.proto))
	c.writeBulk("id")
	c.writeInt(c.id)
	c.writeBulk("mode")
	c.writeBulk("standalone")
	c.writeBulk("role")
	c.writeBulk("master")
	c.writeBulk("modules")
	c.writeArrayHeader(0)
}
