package floodgate

import "github.com/floodgate/floodgate/core"

// Store keeps rate limit state: NewMemoryStore (the default of New), the
// Redis store of package redisstore, or a fallback.Store around it. Give
// one to NewLimiter, which prepares its limits on it once. Package core
// defines the interface and says how to write a Store.
type Store = core.Store

// The bounds on a request.
const (
	// MaxKeyLen is the longest key, in bytes.
	MaxKeyLen = core.MaxKeyLen
	// MaxLimits is the most limits that one Limiter can apply to a key.
	MaxLimits = core.MaxLimits
)
