package relay_test

import (
	"testing"

	"github.com/proteanhq/protean-host/internal/testserver"
)

func TestMain(m *testing.M) { testserver.Main(m) }
