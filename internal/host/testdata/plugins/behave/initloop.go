package main

// initLoop, set with -ldflags "-X main.initLoop=yes", makes the module's
// init loop forever without calling the host. Go runs init in the
// module's _initialize, before any export: the start-function case of the
// deadline tests.
var initLoop string

var initSink int

func init() {
	for initLoop == "yes" {
		initSink++
	}
}
