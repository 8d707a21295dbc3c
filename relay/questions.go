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
// They go questionGroup to an implicit transaction: one setting statement
// and one sync a group, not one of each a question. Each question its
// own transaction cost the server about three times as much as its
// answer: 27 us a question against 8 us in groups of 32, one connection,
// a hundred schemas, quiet (the setting's statement, a transaction's
// start and end, and a flush of the output at every sync); at 1,000 idle
// targets that was 1,000 transactions a second for nothing, and a busy
// target's watch is asked up to 50 times a second.
//
// A group is one transaction, so what one question does reaches the
// others (the review of the groups, questionsattack_internal_test.go):
//
//   - Its locks (AccessShareLock on each target's outbox and index) last
//     until the group's sync. So in a group a question waits at most 2 ms
//     for a lock and runs at most 20 ms (questionGroupSetSQL), where a
//     question alone waits 100 ms and runs as long as it takes: past
//     either, it is asked again alone, in the same call. A DDL of a target
//     asked earlier in the group then waits 20 ms at most, not for
//     another target's lock wait or slow question; and a user's
//     transaction that locks two targets' outboxes never waits on a group
//     for its deadlock_timeout (1 s), so its deadlock check cannot find
//     the group in a cycle (a group that waited 100 ms for one target
//     while holding another's made PostgreSQL abort the user's
//     transaction).
//   - Each question reads in its own snapshot: the group runs READ
//     COMMITTED whatever the session's default (a repeatable read default,
//     from ALTER ROLE or ALTER DATABASE, gave the group one snapshot: a row
//     committed while an earlier question ran went unseen).
//   - A question's error aborts its group: the server skips the rest up
//     to the sync, and askGrouped asks those again in another pipeline
//     (in groups of one once two groups of a pipeline failed: every
//     question failing asked the last of 70 fifty times), so one target's
//     dropped table fails its own question only. A target whose question
//     failed (or, dormant.go, was slow) is asked alone (a group of its
//     own) until one is answered, so a target that keeps failing costs
//     the others one round trip, not a second one every round.

// questionGroup is how many questions share an implicit transaction.
const questionGroup = 32

// questionGroupSetSQL is questionSetSQL for a group of more than one
// question: a 2 ms lock_timeout and a 20 ms statement_timeout (see above).
// A question's answer takes 16-60 us; one slow for dead rows (a held
// horizon) takes milliseconds, and is asked again alone.
const questionGroupSetSQL = `SELECT set_config('lock_timeout', '2ms', true), set_config('statement_timeout', '20ms', true),
	set_config('enable_seqscan', 'off', true), set_config('enable_bitmapscan', 'off', true)`

// readCommittedSQL starts a group: it takes no snapshot, so it may.
const readCommittedSQL = `SET TRANSACTION ISOLATION LEVEL READ COMMITTED`

// askGrouped asks rs their questions in one pipeline on pc, in groups as
// above: send queues relay i's question (and its prepare, if any), read
// reads its answers (the prepare's first) and returns its error. It
// returns each question's error (nil: answered; a server's error), or an
// error of the connection (then the pipeline is closed).
func askGrouped(ctx context.Context, pc *pgconn.PgConn, rs []*Relay,
	send func(p *pgconn.Pipeline, i int), read func(p *pgconn.Pipeline, i int) error) ([]error, error) {
	errs := make([]error, len(rs))
	alone := make([]bool, len(rs)) // asked alone in this call
	for i, r := range rs {
		alone[i] = r.askAlone.Load()
	}
	todo := make([]int, len(rs))
	for i := range todo {
		todo[i] = i
	}
	size := questionGroup
	for len(todo) > 0 {
		groups := groupQuestions(alone, todo, size)
		p := pc.StartPipeline(ctx)
		for _, g := range groups {
			if len(g) > 1 {
				p.SendQueryParams(readCommittedSQL, nil, nil, nil, nil)
				p.SendQueryParams(questionGroupSetSQL, nil, nil, nil, nil)
			} else {
				p.SendQueryParams(questionSetSQL, nil, nil, nil, nil)
			}
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
		aborted := 0
		for _, g := range groups {
			again, late, err := readGroup(p, g, read, errs)
			if err != nil {
				_ = p.Close()
				return nil, err
			}
			if len(again) > 0 {
				aborted++
			}
			if late >= 0 {
				alone[late] = true // past the group's timeouts: asked again alone
			}
			todo = append(todo, again...)
		}
		if err := p.Close(); err != nil {
			return nil, err
		}
		if aborted > 1 {
			size = 1
		}
	}
	for i, r := range rs {
		r.askAlone.Store(errs[i] != nil)
	}
	return errs, nil
}

// groupQuestions splits todo (indexes into rs) into groups of at most
// size, those asked alone in groups of their own.
func groupQuestions(alone []bool, todo []int, size int) [][]int {
	var groups [][]int
	var cur []int
	for _, i := range todo {
		if alone[i] {
			groups = append(groups, []int{i})
			continue
		}
		cur = append(cur, i)
		if len(cur) == size {
			groups, cur = append(groups, cur), nil
		}
	}
	if len(cur) > 0 {
		groups = append(groups, cur)
	}
	return groups
}

// readGroup reads group g's answers: its setting statements', each
// question's through read (its error into errs), then the sync's. It
// returns the questions to ask again: the rest of the group, which the
// server skipped after a question's error, and in a group of more than
// one, first, the question that went past the group's timeouts
// (lock_timeout, statement_timeout or a cancel: its error not recorded),
// which late also names (-1: none). An error of a setting statement, or of
// the sync (the transaction's end), is every unanswered question's.
func readGroup(p *pgconn.Pipeline, g []int, read func(p *pgconn.Pipeline, i int) error, errs []error) (again []int, late int, err error) {
	fail := func(err error) {
		for _, i := range g {
			if errs[i] == nil {
				errs[i] = err
			}
		}
	}
	setting := 1
	if len(g) > 1 {
		setting = 2
	}
	var serr error
	for range setting {
		if _, _, serr = pollResult(p); serr != nil {
			break
		}
	}
	late = -1
	switch {
	case serr != nil && !isPgError(serr):
		return nil, -1, serr
	case serr != nil:
		fail(serr)
	default:
		for k, i := range g {
			qerr := read(p, i)
			if qerr != nil && !isPgError(qerr) {
				return nil, -1, qerr
			}
			if qerr == nil {
				continue
			}
			if len(g) > 1 && (pgerr.IsLockTimeout(qerr) || pgerr.Code(qerr) == pgerr.CodeQueryCanceled) {
				again, late = g[k:], i
			} else {
				errs[i], again = qerr, g[k+1:]
			}
			break
		}
	}
	res, err := p.GetResults()
	if err != nil && isPgError(err) {
		// The group's end failed: its answers are not trusted. (pgconn
		// gives the sync itself next.)
		fail(err)
		again, late = nil, -1
		res, err = p.GetResults()
	}
	if err != nil {
		return nil, -1, err
	}
	if _, ok := res.(*pgconn.PipelineSync); !ok {
		return nil, -1, fmt.Errorf("relay: the Fleet's questions: expected a sync, got %T", res)
	}
	return again, late, nil
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
