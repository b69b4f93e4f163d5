// Command surface measures the module's public surface and its long
// functions, from the source alone (go/parser and go/ast, no type
// checking), so that a change meant to shrink the surface (issue 40) shows
// by how much. Run it from anywhere inside the module:
//
//	go run ./internal/tools/surface        # the figures and the long functions
//	go run ./internal/tools/surface -pkgs  # and each public package's figures
//
// What it reads: every non-test .go file (a name not ending in _test.go)
// of the module's packages as the go command sees them, that is, under the
// directory holding go.mod, skipping testdata directories, directories
// whose name starts with "." or "_", and directories holding another
// go.mod. Build constraints are ignored, so a file for another GOOS counts
// too; an identifier declared in two such files counts once.
//
// What it counts:
//
//   - public packages: the import paths of those directories that have no
//     path element "internal" (Go's rule for what other modules cannot
//     import) and are not cmd/... or plugins/... (mains and example
//     modules, nothing a user imports);
//   - exported identifiers: the exported top-level names of the public
//     packages: functions (not methods), types, vars and consts, each name
//     of a grouped or multi-name declaration once;
//   - exported methods: the method declarations of the public packages
//     with an exported name on an exported receiver type (a method of an
//     unexported type is not in the package's documentation; interface
//     methods are not counted, their interface type is);
//   - long functions: every function and method declaration with a body,
//     in every package read (public or not, mains included), longer than
//     80 lines, counting from the line of the func keyword to the line of
//     the closing brace, both included (the doc comment is not counted;
//     function literals count as part of the declaration holding them).
package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// maxLines is the length a function may have before it is listed.
const maxLines = 80

type pkgStats struct {
	funcs, types, vars, consts, methods map[string]bool
}

func newPkgStats() *pkgStats {
	return &pkgStats{
		funcs: map[string]bool{}, types: map[string]bool{}, vars: map[string]bool{},
		consts: map[string]bool{}, methods: map[string]bool{},
	}
}

type longFunc struct {
	file  string // relative to the module root
	line  int
	lines int
	name  string
}

func main() {
	perPkg := flag.Bool("pkgs", false, "also print each public package's figures")
	flag.Parse()
	if err := run(*perPkg); err != nil {
		fmt.Fprintln(os.Stderr, "surface:", err)
		os.Exit(1)
	}
}

func run(perPkg bool) error {
	root, module, err := findModule()
	if err != nil {
		return err
	}
	dirs, err := packageDirs(root)
	if err != nil {
		return err
	}
	fset := token.NewFileSet()
	public := map[string]*pkgStats{}
	var long []longFunc
	for _, dir := range dirs {
		rel, err := filepath.Rel(root, dir)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		importPath := module
		if rel != "." {
			importPath = module + "/" + rel
		}
		files, err := goFiles(dir)
		if err != nil {
			return err
		}
		var st *pkgStats
		if len(files) > 0 && isPublic(rel) {
			st = newPkgStats()
			public[importPath] = st
		}
		for _, name := range files {
			f, err := parser.ParseFile(fset, filepath.Join(dir, name), nil, parser.SkipObjectResolution)
			if err != nil {
				return err
			}
			if st != nil {
				st.add(f)
			}
			long = append(long, longFuncs(fset, root, f)...)
		}
	}
	return report(module, public, long, perPkg)
}

// findModule returns the directory holding go.mod, at or above the working
// directory, and the module path it declares.
func findModule() (root, module string, err error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", "", err
	}
	for {
		f, err := os.Open(filepath.Join(dir, "go.mod"))
		if err == nil {
			defer f.Close()
			sc := bufio.NewScanner(f)
			for sc.Scan() {
				if rest, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "module "); ok {
					return dir, strings.Trim(strings.TrimSpace(rest), `"`), nil
				}
			}
			if err := sc.Err(); err != nil {
				return "", "", err
			}
			return "", "", fmt.Errorf("%s: no module line", f.Name())
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return "", "", err
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", "", errors.New("no go.mod at or above the working directory")
		}
		dir = parent
	}
}

// packageDirs returns the module's directories as the go command walks
// them (see the package comment), sorted; some may hold no .go file.
func packageDirs(root string) ([]string, error) {
	var dirs []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		if p != root {
			name := d.Name()
			if name == "testdata" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") {
				return filepath.SkipDir
			}
			if _, err := os.Stat(filepath.Join(p, "go.mod")); err == nil {
				return filepath.SkipDir // another module
			}
		}
		dirs = append(dirs, p)
		return nil
	})
	sort.Strings(dirs)
	return dirs, err
}

// goFiles returns the names of dir's non-test .go files, sorted.
func goFiles(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, e := range entries {
		n := e.Name()
		if !e.IsDir() && strings.HasSuffix(n, ".go") && !strings.HasSuffix(n, "_test.go") &&
			!strings.HasPrefix(n, ".") && !strings.HasPrefix(n, "_") {
			names = append(names, n)
		}
	}
	return names, nil
}

// isPublic reports whether the directory rel (slash-separated, relative
// to the module root) is a public package by the package comment's rule.
func isPublic(rel string) bool {
	for _, el := range strings.Split(rel, "/") {
		if el == "internal" {
			return false
		}
	}
	first, _, _ := strings.Cut(rel, "/")
	return first != "cmd" && first != "plugins"
}

// add records f's exported top-level identifiers and methods.
func (st *pkgStats) add(f *ast.File) {
	for _, decl := range f.Decls {
		switch d := decl.(type) {
		case *ast.FuncDecl:
			if !d.Name.IsExported() {
				continue
			}
			if d.Recv == nil {
				st.funcs[d.Name.Name] = true
				continue
			}
			if recv := receiverType(d.Recv); ast.IsExported(recv) {
				st.methods[recv+"."+d.Name.Name] = true
			}
		case *ast.GenDecl:
			for _, spec := range d.Specs {
				switch s := spec.(type) {
				case *ast.TypeSpec:
					if s.Name.IsExported() {
						st.types[s.Name.Name] = true
					}
				case *ast.ValueSpec:
					for _, n := range s.Names {
						if !n.IsExported() {
							continue
						}
						if d.Tok == token.CONST {
							st.consts[n.Name] = true
						} else {
							st.vars[n.Name] = true
						}
					}
				}
			}
		}
	}
}

// receiverType returns the name of a method's receiver base type (T of
// T, *T, T[P] or *T[P]).
func receiverType(recv *ast.FieldList) string {
	if recv == nil || len(recv.List) == 0 {
		return ""
	}
	e := recv.List[0].Type
	for {
		switch t := e.(type) {
		case *ast.StarExpr:
			e = t.X
		case *ast.ParenExpr:
			e = t.X
		case *ast.IndexExpr:
			e = t.X
		case *ast.IndexListExpr:
			e = t.X
		case *ast.Ident:
			return t.Name
		default:
			return ""
		}
	}
}

// longFuncs returns f's function declarations longer than maxLines.
func longFuncs(fset *token.FileSet, root string, f *ast.File) []longFunc {
	var out []longFunc
	for _, decl := range f.Decls {
		d, ok := decl.(*ast.FuncDecl)
		if !ok || d.Body == nil {
			continue
		}
		start := fset.Position(d.Type.Func)
		end := fset.Position(d.Body.Rbrace)
		n := end.Line - start.Line + 1
		if n <= maxLines {
			continue
		}
		name := d.Name.Name
		if recv := receiverType(d.Recv); recv != "" {
			name = recv + "." + name
		}
		file, err := filepath.Rel(root, start.Filename)
		if err != nil {
			file = start.Filename
		}
		out = append(out, longFunc{file: filepath.ToSlash(file), line: start.Line, lines: n, name: name})
	}
	return out
}

// report prints the figures.
func report(module string, public map[string]*pkgStats, long []longFunc, perPkg bool) error {
	var paths []string
	var funcs, types, vars, consts, methods int
	for p := range public {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	for _, p := range paths {
		st := public[p]
		funcs += len(st.funcs)
		types += len(st.types)
		vars += len(st.vars)
		consts += len(st.consts)
		methods += len(st.methods)
	}
	fmt.Printf("module %s (non-test .go files; see go doc ./internal/tools/surface for what counts)\n", module)
	fmt.Printf("public packages:      %d\n", len(paths))
	fmt.Printf("exported identifiers: %d (funcs %d, types %d, vars %d, consts %d)\n",
		funcs+types+vars+consts, funcs, types, vars, consts)
	fmt.Printf("exported methods:     %d\n", methods)
	if perPkg {
		for _, p := range paths {
			st := public[p]
			fmt.Printf("  %-50s identifiers %3d  methods %3d\n", strings.TrimPrefix(p, module+"/"),
				len(st.funcs)+len(st.types)+len(st.vars)+len(st.consts), len(st.methods))
		}
	}
	sort.Slice(long, func(i, j int) bool {
		if long[i].file != long[j].file {
			return long[i].file < long[j].file
		}
		return long[i].line < long[j].line
	})
	fmt.Printf("functions over %d lines: %d\n", maxLines, len(long))
	for _, l := range long {
		fmt.Printf("  %-50s %4d lines  %s\n", fmt.Sprintf("%s:%d", l.file, l.line), l.lines, l.name)
	}
	return nil
}
