package main

import (
	"context"
	"flag"
	"fmt"
	"strings"

	"github.com/proteanhq/protean-host/internal/auth"
)

// keysUsage is the keys command's one form.
const keysUsage = "usage: protean-host keys new TENANT --role ROLE (read, write, operator, deployer, admin; an admin key may omit TENANT)"

// cmdKeys prints a new API key once, with the [[http.auth.keys]] lines
// that let it in: the config keeps only the key's SHA-256. It reads no
// config and changes none.
func cmdKeys(_ context.Context, e *env, args []string) error {
	if e.help && (len(args) == 0 || args[0] != "new") {
		fmt.Fprintln(e.stdout, keysUsage)
		return flag.ErrHelp
	}
	if len(args) == 0 || args[0] != "new" {
		return usagef("%s", keysUsage)
	}
	fs := e.flagSet("keys new")
	roleName := fs.String("role", "", "the key's `ROLE`: read, write, operator, deployer or admin")
	rest := args[1:]
	tenant := ""
	if len(rest) > 0 && !strings.HasPrefix(rest[0], "-") {
		tenant, rest = rest[0], rest[1:]
	}
	if err := parseFlags(fs, rest); err != nil {
		return err
	}
	switch {
	case fs.NArg() == 1 && tenant == "":
		tenant = fs.Arg(0)
	case fs.NArg() > 0:
		return usagef("unexpected arguments: %v; %s", fs.Args(), keysUsage)
	}
	role, err := auth.ParseRole(*roleName)
	if err != nil {
		return usageError{fmt.Errorf("--role: %w", err)}
	}
	if tenant == "" && role != auth.RoleAdmin {
		return usagef("a %s key needs a TENANT; %s", role, keysUsage)
	}
	key, hash, err := auth.NewKey()
	if err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "API key (shown once; send it as Authorization: Bearer KEY):\n\n  %s\n\n", key)
	fmt.Fprintf(e.stdout, "Add to the config, then restart the host:\n\n[[http.auth.keys]]\ntenant = %q\nrole = %q\nsha256 = %q\n", tenant, role, hash)
	return nil
}
