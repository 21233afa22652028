package storekit

import (
	"fmt"
	"hash/fnv"

	"github.com/floodgate/floodgate/core/slot"
)

// PermitIDLen is the length of the ids NewPermitID makes: 32 hex digits
// of randomness, '-', and 8 hex digits tagging the key. It is at most
// slot.MaxPermitIDLen.
const PermitIDLen = 32 + 1 + 8

// NewPermitID returns a permit id for key from 16 random bytes: 32 hex
// digits, '-', and a tag of 8 hex digits that a hash of key gives, so that
// a permit released or extended on another key is recognised as a
// mistake (CheckPermitID) rather than reported as not held. The tag is no
// secret: the random part is what makes a permit unguessable.
func NewPermitID(key string, random [16]byte) string {
	const hexd = "0123456789abcdef"
	b := make([]byte, 0, PermitIDLen)
	for _, c := range random {
		b = append(b, hexd[c>>4], hexd[c&15])
	}
	b = append(b, '-')
	t := keyTag(key)
	for i := 28; i >= 0; i -= 4 {
		b = append(b, hexd[(t>>i)&15])
	}
	return string(b)
}

func keyTag(key string) uint32 {
	h := fnv.New32a()
	h.Write([]byte(key))
	return h.Sum32()
}

// CheckPermitID returns nil when id could be a permit that NewPermitID
// made for key, and otherwise an error wrapping slot.ErrInvalidPermit that
// says why: empty, longer than slot.MaxPermitIDLen, not of the form, or
// tagged for another key.
func CheckPermitID(key, id string) error {
	switch {
	case id == "":
		return fmt.Errorf("%w: empty permit id", slot.ErrInvalidPermit)
	case len(id) > slot.MaxPermitIDLen:
		return fmt.Errorf("%w: permit id is %d bytes, more than the maximum %d", slot.ErrInvalidPermit, len(id), slot.MaxPermitIDLen)
	}
	if len(id) != PermitIDLen || id[32] != '-' {
		return fmt.Errorf("%w: %q is not a permit id (32 hex digits, '-', 8 hex digits)", slot.ErrInvalidPermit, id)
	}
	for i := 0; i < PermitIDLen; i++ {
		c := id[i]
		if i != 32 && !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return fmt.Errorf("%w: %q is not a permit id (32 hex digits, '-', 8 hex digits)", slot.ErrInvalidPermit, id)
		}
	}
	want := NewPermitID(key, [16]byte{})[33:]
	if id[33:] != want {
		return fmt.Errorf("%w: permit %q was issued for another key", slot.ErrInvalidPermit, id)
	}
	return nil
}
