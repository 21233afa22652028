package redisstore

// SlotOf exports slotOf to the tests.
var SlotOf = slotOf

// DisableFastPath makes s send every decision through decide.lua, so that
// the tests can hold bucket.lua and decide.lua to the same results.
func (s *Store) DisableFastPath() { s.noFastPath = true }
