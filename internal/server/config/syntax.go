package config

import (
	"bytes"
	"regexp"
	"sort"
	"strings"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"
)

// yamlLine is the position that the yaml library puts in its syntax
// errors: the 0-based line where the construct around the problem began
// (a block, a flow sequence, a quoted scalar), not where the problem is.
var yamlLine = regexp.MustCompile(`^yaml: (line \d+: )?`)

// syntaxError returns the Error for data's YAML syntax error err, at the
// line and column (1-based, in characters) where the problem is.
func syntaxError(file string, data []byte, err error) *Error {
	msg := yamlLine.ReplaceAllString(err.Error(), "")
	line, col := problemAt(data, msg)
	return &Error{File: file, Line: line, Column: col, Msg: msg}
}

// problemAt finds where the yaml library gives up on data with the
// problem msg: the last character of the shortest beginning of data that
// fails to parse with the same message, found by bisection over whole
// lines and then over the characters of the last line, so a few dozen
// parses at most. A key's problem is found at its colon, where the parser
// learns that it is a key; an unclosed flow collection's at the last
// character inside it; the end of the stream's at the end of data. It
// returns 0, 0 when no beginning of data fails the same way.
func problemAt(data []byte, msg string) (line, col int) {
	if strings.Contains(msg, "end of stream") {
		// Any beginning of data ends too soon too: the end is the place.
		line = bytes.Count(data, []byte("\n")) + 1
		return line, utf8.RuneCount(data[bytes.LastIndexByte(data, '\n')+1:]) + 1
	}
	failsAt := func(n int) bool {
		var doc yaml.Node
		err := yaml.Unmarshal(data[:n], &doc)
		return err != nil && yamlLine.ReplaceAllString(err.Error(), "") == msg
	}
	// ends[i] is the length of the first i+1 lines.
	var ends []int
	for i := 0; i < len(data); {
		j := bytes.IndexByte(data[i:], '\n')
		if j < 0 {
			j = len(data) - i - 1
		}
		i += j + 1
		ends = append(ends, i)
	}
	k := sort.Search(len(ends), func(i int) bool { return failsAt(ends[i]) })
	if k == len(ends) {
		return 0, 0
	}
	start := 0
	if k > 0 {
		start = ends[k-1]
	}
	c := sort.Search(ends[k]-start, func(j int) bool { return failsAt(start + j + 1) })
	return k + 1, utf8.RuneCount(data[start:start+c]) + 1
}
