package main

import (
	"context"
	"errors"
)

func cmdDemo(ctx context.Context, a *app, args []string) error {
	return errors.New("demo: not implemented yet")
}
