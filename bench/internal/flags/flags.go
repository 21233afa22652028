// Package flags parses the command-line lists that the benchmark programs
// share.
package flags

import (
	"log"
	"strconv"
	"strings"
)

// Counts parses list, the value of the flag called name, as
// comma-separated positive numbers (concurrency levels, descriptors per
// request), or exits with a message that names the flag.
func Counts(name, list string) []int {
	var ns []int
	for _, f := range strings.Split(list, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			log.Fatalf("%s: %q is not a positive number", name, f)
		}
		ns = append(ns, n)
	}
	return ns
}
