//go:build !unix

package main

func openFileLimit() (int, bool) { return 0, false }
