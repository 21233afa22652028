// Package slicepool reuses the slices that a call needs only while it runs:
// a group's requests, a request's checks. Handing them to an interface
// method makes them escape, so without reuse each call allocates them.
package slicepool

import "sync"

// Pool hands out slices of T and takes them back. Its zero value is ready
// to use, and it is safe for concurrent use; like sync.Pool, it must not
// be copied after first use.
type Pool[T any] struct {
	p sync.Pool // of *[]T
}

// Get returns a slice of n zero values of T, reused when one that large
// was put back. Give it back with Put once nothing refers to it.
func (p *Pool[T]) Get(n int) *[]T {
	s, _ := p.p.Get().(*[]T)
	if s == nil || cap(*s) < n {
		s = new([]T)
		*s = make([]T, n)
		return s
	}
	// Cleared up to its capacity, so that what a larger call left does
	// not stay reachable.
	clear((*s)[:cap(*s)])
	*s = (*s)[:n]
	return s
}

// Put gives s back for a later Get.
func (p *Pool[T]) Put(s *[]T) { p.p.Put(s) }
