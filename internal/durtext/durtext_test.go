package durtext

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestShort(t *testing.T) {
	t.Parallel()
	for d, want := range map[time.Duration]string{
		0:                                     "-",
		120 * time.Millisecond:                "120ms",
		41*time.Second + 400*time.Millisecond: "41s",
		2*time.Hour + 10*time.Minute:          "2h10m",
		3 * time.Hour:                         "3h",
		-50 * time.Minute:                     "-50m",
		10 * time.Minute:                      "10m",
		76 * time.Hour:                        "3d4h",
		72 * time.Hour:                        "3d",
	} {
		require.Equal(t, want, Short(d), "%v", time.Duration(d))
	}
}
