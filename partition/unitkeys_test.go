package partition_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/partition"
)

// ParseUnit is PartitionUnit's inverse, for Protean's "::" categories too,
// and takes a unit's lane streams; what is not a unit is ErrInvalidUnit.
func TestParseUnit(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name, cat, key string
		bad            string // a fragment of the error; "" when valid
	}{
		{name: "order:c-1", cat: "order", key: "c-1"},
		{name: "test::order:c-1", cat: "test::order", key: "c-1"},
		{name: "app::billing::invoice:42", cat: "app::billing::invoice", key: "42"},
		{name: "test::order:c-1:backfill", cat: "test::order", key: "c-1"},
		{name: "order:c-1:dlq", cat: "order", key: "c-1"},
		{name: "order:c-1:slow", cat: "order:c-1", key: "slow"}, // a lane token is configured, not guessed
		{name: "", bad: "want {category}:{key}"},
		{name: "order", bad: "want {category}:{key}"},
		{name: "order:", bad: "partition key is null or empty"},
		{name: "test::order:", bad: "partition key is null or empty"},
		{name: ":c-1", bad: "empty category"},
		{name: "order:backfill", bad: "want {category}:{key}"},
		{name: "order:c-1:dlq:dlq", bad: "reserved lane/DLQ token"},
		{name: "order:__partitions__", bad: "reserved '__name__' sentinel"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cat, key, err := partition.ParseUnit(c.name, "backfill")
			if c.bad != "" {
				require.ErrorIs(t, err, partition.ErrInvalidUnit)
				require.ErrorContains(t, err, c.bad)
				require.ErrorContains(t, err, `"`+c.name+`"`, "the error names the input")
				return
			}
			require.NoError(t, err)
			require.Equal(t, [2]string{c.cat, c.key}, [2]string{cat, key})
			if c.name == partition.PartitionUnit(cat, key) {
				return
			}
			// A lane stream answers its unit, which parses to itself.
			cat2, key2, err := partition.ParseUnit(partition.PartitionUnit(cat, key), "backfill")
			require.NoError(t, err)
			require.Equal(t, [2]string{cat, key}, [2]string{cat2, key2})
		})
	}
}
