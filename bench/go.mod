module github.com/floodgate/floodgate/bench

go 1.26.0

require github.com/floodgate/floodgate v0.0.0

require golang.org/x/time v0.16.0

replace github.com/floodgate/floodgate => ../
