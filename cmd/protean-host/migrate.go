package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/proteanhq/protean-host/internal/schema"
)

func cmdMigrate(ctx context.Context, e *env, args []string) error {
	if err := e.parse(e.configFlags("migrate"), args); err != nil {
		return err
	}
	pool, err := openPool(ctx, e.cfg)
	if errors.Is(err, errMemoryOnly) {
		fmt.Fprintln(e.stdout, "nothing to migrate: the configured stores are in memory")
		return nil
	}
	if err != nil {
		return err
	}
	defer pool.Close()
	applied, err := schema.Migrate(ctx, pool)
	for _, name := range applied {
		fmt.Fprintf(e.stdout, "applied %s\n", name)
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "schema at version %d\n", schema.Latest())
	return nil
}
