package dbconf

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestRedactDSN(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"postgres://alice:hunter2@db:5432/app?sslmode=disable": "postgres://alice:xxxxx@db:5432/app?sslmode=disable",
		"postgres://alice@db/app":                              "postgres://alice@db/app",
		"postgres://db/app?password=hunter2&user=a":            "postgres://db/app?password=xxxxx&user=a",
		"host=db user=alice password=hunter2 dbname=app":       "host=db user=alice password=xxxxx dbname=app",
		"host=db password='hun ter2' dbname=app":               "host=db password=xxxxx dbname=app",
		"":                                                     "",
	} {
		got := RedactDSN(in)
		require.Equal(t, want, got, in)
		require.NotContains(t, got, "hunter2")
	}
}

func TestRedactErr(t *testing.T) {
	t.Parallel()
	dsn := "postgres://alice:hunter2@db/app"
	msg := RedactErr(errors.New("cannot parse `"+dsn+"`: password hunter2 rejected"), dsn)
	require.NotContains(t, msg, "hunter2")
	require.Contains(t, msg, "alice:xxxxx@db")
}

func TestConfigKeepsTheDSNsApplicationName(t *testing.T) {
	t.Parallel()
	cfg, err := Config("postgres://u@db/app?application_name=billing", "s1", 3, "pgbox-relay")
	require.NoError(t, err)
	require.Equal(t, "billing", cfg.ConnConfig.RuntimeParams["application_name"])
	require.Equal(t, "s1", cfg.ConnConfig.RuntimeParams["search_path"])
	require.EqualValues(t, 3, cfg.MaxConns)
	cfg, err = Config("postgres://u@db/app", "", 0, "pgbox-relay")
	require.NoError(t, err)
	require.Equal(t, "pgbox-relay", cfg.ConnConfig.RuntimeParams["application_name"])

	_, err = Config("postgres://alice:hunter2@db:notaport/app", "", 0, "x")
	require.Error(t, err)
	require.NotContains(t, err.Error(), "hunter2")
}
