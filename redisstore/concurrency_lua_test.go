package redisstore

import (
	"strings"
	"testing"
)

// slots.lua holds no constant of Go's but as {{NAME}}, each one of
// slotLuaConstants, and every one is used.
func TestSlotLuaConstants(t *testing.T) {
	if got := expandSlotLua(slotsSource); strings.Contains(got, "{{") {
		t.Error("slots.lua keeps a placeholder after expansion")
	}
	for name := range slotLuaConstants {
		if !strings.Contains(slotsSource, "{{"+name+"}}") {
			t.Errorf("slotLuaConstants' %s is not used by slots.lua", name)
		}
	}
	for _, line := range strings.Split(slotsSource, "\n") {
		m := luaLocal.FindStringSubmatch(line)
		if m != nil && strings.ToUpper(m[2]) == m[2] && !luaPlaceholder.MatchString(m[3]) && luaLiteral.MatchString(strings.TrimSpace(m[3])) {
			t.Errorf("slots.lua declares a literal string constant: %s", line)
		}
	}
}
