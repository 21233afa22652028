package config

// This file explains Lookup: the steps of its walk down a domain's tree,
// for the explain API (package envoy's Explain).

// Step is what one entry of a request's descriptor matched in a domain's
// tree, as Lookup walks it.
type Step struct {
	Entry Entry
	// Node is the descriptor the entry matched; nil when it matched none,
	// which ends the walk.
	Node *Descriptor
	// By says how: "value" (the entry's key and value), "wildcard" (a
	// value with *, in Wildcard: "key_value*"), "key" (the key alone,
	// whatever the value) or "" (none).
	By       string
	Wildcard string
}

// Trace returns the steps of Lookup's walk for entries, one per entry it
// reached: it stops after an entry that matched nothing, and after one
// whose descriptor has no children, as Lookup does; and Lookup's Match.
// The limit applies only when the last entry was reached and its
// descriptor has one.
func (d *Domain) Trace(entries []Entry) ([]Step, Match) {
	steps := make([]Step, 0, len(entries))
	node := &d.Root
	for _, e := range entries {
		st := Step{Entry: e}
		name := e.Key + "_" + e.Value
		if n := node.Children[name]; n != nil {
			st.Node, st.By = n, "value"
		} else {
			for _, w := range node.Wildcards {
				if w.Match(name) {
					st.Node, st.By, st.Wildcard = node.Children[w.Name], "wildcard", w.Name
					break
				}
			}
		}
		if st.Node == nil {
			if n := node.Children[e.Key]; n != nil {
				st.Node, st.By = n, "key"
			}
		}
		steps = append(steps, st)
		if st.Node == nil || len(st.Node.Children) == 0 {
			break
		}
		node = st.Node
	}
	return steps, d.Lookup(entries)
}
