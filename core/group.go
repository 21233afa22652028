package core

// Request is one request of a group that Store.TakeGroup decides in one
// step: a cost on a key under one of the Store's Policies.
type Request struct {
	// Policy is the limits that decide the request; a Policy the Store
	// prepared.
	Policy Policy
	// Key and N are the request's key and cost, as Take takes them.
	Key string
	N   int64
	// Force charges N whatever the limits say, as Policy.Charge does,
	// instead of taking it.
	Force bool
	// Advisory marks a request whose denial does not undo an all-or-nothing
	// group: a limit in shadow mode, say, that is counted but never
	// enforced.
	Advisory bool
	// Decision is the request's answer, set by TakeGroup.
	Decision Decision
}
