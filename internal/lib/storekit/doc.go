// Package storekit is what floodgate's own stores (the memory store, the
// Redis store, the fallback store) share beyond the contract in package
// core: the checks of their input, the all-or-nothing bookkeeping of a
// group, the carrying of usage across changed limits, and permit ids. A
// store outside this repository does its own input checks; these helpers
// are not part of the API.
package storekit
