package httplimit

// The header fields the middleware writes.
const (
	HeaderPolicy     = "RateLimit-Policy"
	HeaderRateLimit  = "RateLimit"
	HeaderRetryAfter = "Retry-After"
	HeaderLimit      = "X-RateLimit-Limit"
	HeaderRemaining  = "X-RateLimit-Remaining"
	HeaderReset      = "X-RateLimit-Reset"
)
