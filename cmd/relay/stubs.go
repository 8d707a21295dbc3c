package main

import (
	"context"
	"errors"
)

// relayOptions are the relay's settings (filled in when the relay package lands).
type relayOptions struct{}

func (r *relayOptions) bind(s *settings) {}
func (r *relayOptions) validate() error  { return nil }

func cmdRun(ctx context.Context, a *app, args []string) error    { return errors.New("not yet") }
func cmdStatus(ctx context.Context, a *app, args []string) error { return errors.New("not yet") }
func cmdDemo(ctx context.Context, a *app, args []string) error   { return errors.New("not yet") }
