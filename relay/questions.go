package relay

import (
	"context"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgbox/pgbox/internal/pgerr"
)

// The Fleet's questions: the idle poll's (dormant.go) and the busy
// targets' watch's (sharedwatch.go), many targets asked in one pipeline.
//
// They go questionGroup to an implicit transaction: one questionSetSQL
// and one sync a group, not one of each a question. Each question its
// own transaction cost the server about three times as much as its
// answer: 27 us a question against 8 us in groups of 32, one connection,
// a hundred schemas, quiet (the setting's statement, a transaction's
// start and end, and a flush of the output at every sync); at 1,000 idle
// targets that was 1,000 transactions a second for nothing, and a busy
// target's watch is asked up to 50 times a second. Each statement of a
// group still reads in its own snapshot (READ COMMITTED); its locks
// (AccessShareLock on a target's outbox and index) last until the
// group's sync, a millisecond or so.
//
// A question's error aborts its group: the server skips the rest up to
// the sync, and askGrouped asks those again in another pipeline, so one
// target's dropped table or held lock (lock_timeout) fails its own
// question only. A target whose question failed is asked alone (a group
// of its own) until one is answered, so a target that keeps failing
// costs the others one round trip, not a second one every round.

// questionGroup is how many questions share an implicit transaction.
const questionGroup = 32

// askGrouped asks rs their questions in one pipeline on pc, in groups as
// above: send queues relay i's question (and its prepare, if any), read
// reads its answers (the prepare's first) and returns its error. It
// returns each question's error (nil: answered; a server's error), or an
// error of the connection (then the pipeline is closed).
func askGrouped(ctx context.Context, pc *pgconn.PgConn, rs []*Relay,
	send func(p *pgconn.Pipeline, i int), read func(p *pgconn.Pipeline, i int) error) ([]error, error) {
	errs := make([]error, len(rs))
	todo := make([]int, len(rs))
	for i := range todo {
		todo[i] = i
	}
	for len(todo) > 0 {
		groups := groupQuestions(rs, todo)
		p := pc.StartPipeline(ctx)
		for _, g := range groups {
			p.SendQueryParams(questionSetSQL, nil, nil, nil, nil)
			for _, i := range g {
				send(p, i)
			}
			p.SendPipelineSync()
		}
		if err := p.Flush(); err != nil {
			_ = p.Close()
			return nil, err
		}
		todo = todo[:0:0]
		for _, g := range groups {
			skipped, err := readGroup(p, g, read, errs)
			if err != nil {
				_ = p.Close()
				return nil, err
			}
			todo = append(todo, skipped...)
		}
		if err := p.Close(); err != nil {
			return nil, err
		}
	}
	for i, r := range rs {
		r.askAlone.Store(errs[i] != nil)
	}
	return errs, nil
}

// groupQuestions splits todo (indexes into rs) into groups of at most
// questionGroup, a relay whose last question failed in a group of its own.
func groupQuestions(rs []*Relay, todo []int) [][]int {
	var groups [][]int
	var cur []int
	for _, i := range todo {
		if rs[i].askAlone.Load() {
			groups = append(groups, []int{i})
			continue
		}
		cur = append(cur, i)
		if len(cur) == questionGroup {
			groups, cur = append(groups, cur), nil
		}
	}
	if len(cur) > 0 {
		groups = append(groups, cur)
	}
	return groups
}

// readGroup reads group g's answers: questionSetSQL's, each question's
// through read (its error into errs), then the sync. After a question's
// error the server skipped the rest of the group: skipped returns them.
// An error of questionSetSQL is every question's of the group.
func readGroup(p *pgconn.Pipeline, g []int, read func(p *pgconn.Pipeline, i int) error, errs []error) (skipped []int, err error) {
	_, _, serr := pollResult(p)
	switch {
	case serr != nil && !isPgError(serr):
		return nil, serr
	case serr != nil:
		for _, i := range g {
			errs[i] = serr
		}
	default:
		for k, i := range g {
			qerr := read(p, i)
			if qerr != nil && !isPgError(qerr) {
				return nil, qerr
			}
			if qerr != nil {
				errs[i] = qerr
				skipped = g[k+1:]
				break
			}
		}
	}
	res, err := p.GetResults()
	if err != nil {
		return nil, err
	}
	if _, ok := res.(*pgconn.PipelineSync); !ok {
		return nil, fmt.Errorf("relay: the Fleet's questions: expected a sync, got %T", res)
	}
	return skipped, nil
}

// sendQuestion queues a question on p: through its statement prepared on
// the connection (prepared[key]), or prepared now under a fresh name when
// prepared has room (the name returned: readQuestion records it once the
// prepare succeeded), or unnamed (prepared nil: a pooler in transaction
// mode).
func sendQuestion(p *pgconn.Pipeline, prepared map[string]string, key, prefix, sql string, params [][]byte, oids []uint32) (preparing string) {
	name, ok := prepared[key]
	switch {
	case ok:
		p.SendQueryPrepared(name, params, nil, nil)
	case prepared != nil && len(prepared) < idlePreparedMax:
		preparing = prefix + strconv.FormatInt(idleNames.Add(1), 10)
		p.SendPrepare(preparing, sql, oids)
		p.SendQueryPrepared(preparing, params, nil, nil)
	default:
		p.SendQueryParams(sql, params, oids, nil, nil)
	}
	return preparing
}

// readQuestion reads a question's answers: its prepare's when preparing
// names one (recorded in prepared under key once it succeeded: a prepared
// statement outlives its transaction's abort), then its result through
// result. A statement the connection no longer has (a pooler's DISCARD
// ALL) is forgotten, to be prepared again next time.
func readQuestion(p *pgconn.Pipeline, prepared map[string]string, key, preparing string, result func() error) error {
	if preparing != "" {
		if err := pollPrepared(p); err != nil {
			return err
		}
		prepared[key] = preparing
	}
	err := result()
	if pgerr.Code(err) == pgerr.CodeInvalidSQLStatementName {
		delete(prepared, key)
	}
	return err
}
