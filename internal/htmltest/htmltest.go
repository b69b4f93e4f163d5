// Package htmltest reads a server-rendered HTML page into a small tree
// for tests to find rows and cells in, with encoding/xml's lenient HTML
// mode (no dependency). A page it cannot read is an error, which keeps
// the templates well formed.
package htmltest

import (
	"encoding/xml"
	"errors"
	"io"
	"strings"
)

// Node is an element: its name, attributes, children and the text
// directly inside it.
type Node struct {
	Name     string
	Attr     map[string]string
	Children []*Node
	Text     string
}

// Parse reads an HTML page.
func Parse(r io.Reader) (*Node, error) {
	dec := xml.NewDecoder(r)
	dec.Strict = false
	dec.AutoClose = xml.HTMLAutoClose
	dec.Entity = xml.HTMLEntity
	root := &Node{Name: "#root", Attr: map[string]string{}}
	stack := []*Node{root}
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			return root, nil
		}
		if err != nil {
			return nil, err
		}
		switch tk := tok.(type) {
		case xml.StartElement:
			n := &Node{Name: tk.Name.Local, Attr: map[string]string{}}
			for _, a := range tk.Attr {
				n.Attr[a.Name.Local] = a.Value
			}
			top := stack[len(stack)-1]
			top.Children = append(top.Children, n)
			stack = append(stack, n)
		case xml.EndElement:
			if len(stack) > 1 {
				stack = stack[:len(stack)-1]
			}
		case xml.CharData:
			stack[len(stack)-1].Text += string(tk)
		}
	}
}

// All returns the elements under n (n included) with class among their
// classes and, if kv is a key and a value, that attribute value.
func (n *Node) All(class string, kv ...string) []*Node {
	var out []*Node
	var walk func(*Node)
	walk = func(m *Node) {
		if strings.Contains(" "+m.Attr["class"]+" ", " "+class+" ") && (len(kv) < 2 || m.Attr[kv[0]] == kv[1]) {
			out = append(out, m)
		}
		for _, c := range m.Children {
			walk(c)
		}
	}
	walk(n)
	return out
}

// AllText is all the text under n, with runs of white space collapsed.
func (n *Node) AllText() string {
	var b strings.Builder
	var walk func(*Node)
	walk = func(m *Node) {
		b.WriteString(m.Text + " ")
		for _, c := range m.Children {
			walk(c)
		}
	}
	walk(n)
	return strings.Join(strings.Fields(b.String()), " ")
}

// Cells returns the texts of a table row's cells.
func (n *Node) Cells() []string {
	var out []string
	for _, c := range n.Children {
		if c.Name == "td" {
			out = append(out, c.AllText())
		}
	}
	return out
}
