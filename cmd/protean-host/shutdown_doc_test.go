package main

import (
	"go/ast"
	"go/parser"
	"go/token"
	"strings"
	"testing"
)

// TestShutdownDocNamesItsOrder checks shutdown's doc against the list it
// runs: each component, by name, in the order shutdown stops them. A
// component added, removed or moved without the doc fails here.
func TestShutdownDocNamesItsOrder(t *testing.T) {
	t.Parallel()
	f, err := parser.ParseFile(token.NewFileSet(), "run.go", nil, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	var doc string
	for _, d := range f.Decls {
		if fn, ok := d.(*ast.FuncDecl); ok && fn.Name.Name == "shutdown" && fn.Doc != nil {
			doc = strings.Join(strings.Fields(fn.Doc.Text()), " ")
		}
	}
	if doc == "" {
		t.Fatal("run.go: shutdown has no doc")
	}
	at := 0
	for _, c := range (&hostProcess{}).components() {
		i := strings.Index(doc[at:], c.name)
		if i < 0 {
			t.Fatalf("shutdown's doc does not name %q after %q", c.name, doc[:at])
		}
		at += i + len(c.name)
	}
}
