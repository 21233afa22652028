package redisstore

import "strings"

// slotOf returns the Redis Cluster slot of key: CRC16 of its hash tag (the
// part between the first { and the next }, when not empty) modulo 16384.
func slotOf(key string) int {
	if s := strings.IndexByte(key, '{'); s >= 0 {
		if e := strings.IndexByte(key[s+1:], '}'); e > 0 {
			key = key[s+1 : s+1+e]
		}
	}
	var crc uint16
	for i := 0; i < len(key); i++ {
		crc = crc<<8 ^ crc16Table[byte(crc>>8)^key[i]]
	}
	return int(crc) & 16383
}

// crc16Table is CRC-16/XMODEM (polynomial 0x1021), which Redis Cluster
// uses for key slots.
var crc16Table = func() (t [256]uint16) {
	for i := range t {
		crc := uint16(i) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
		t[i] = crc
	}
	return t
}()

// groupBySlot splits calls by the Cluster slot of their keys, in the order
// the slots first appear: one script call each.
func groupBySlot(calls []*call) [][]*call {
	bySlot := map[int][]*call{}
	var order []int
	for _, c := range calls {
		if _, ok := bySlot[c.slot]; !ok {
			order = append(order, c.slot)
		}
		bySlot[c.slot] = append(bySlot[c.slot], c)
	}
	groups := make([][]*call, len(order))
	for i, slot := range order {
		groups[i] = bySlot[slot]
	}
	return groups
}
