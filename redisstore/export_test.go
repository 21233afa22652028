package redisstore

// SlotOf exports slotOf to the tests.
var SlotOf = slotOf
