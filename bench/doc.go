// Package bench compares floodgate with its peers. It is a module of its
// own so that the library's go.mod does not pull the peers in.
//
//	cd bench && go test -run - -bench . -benchmem -count 5
package bench
