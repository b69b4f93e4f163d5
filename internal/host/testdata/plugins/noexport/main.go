// Command noexport is a valid WASI module with no protean exports.
package main

//go:wasmexport something_else
func somethingElse() int32 { return 0 }

func main() {}
