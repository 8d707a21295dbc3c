package console

import "context"

// CSRFTokenFor is the CSRF token h's forms carry for id: tests use it for
// people who are shown no form (viewers), to check that the role, not the
// missing token, refuses them.
func (h *Handler) CSRFTokenFor(ctx context.Context, id Identity) (string, error) {
	return h.csrf.token(ctx, id)
}
