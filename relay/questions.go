package relay

import (
	"cmp"
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

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
// others (two reviews of the groups: questionsattack_internal_test.go and
// questionsq2attack_internal_test.go):
//
//   - Its locks (AccessShareLock on each target's outbox and index) last
//     until the group's sync. So a group is closed once the answers its
//     targets took last time (Relay.askTook; askUnknown for a target not
//     answered yet) add up to groupBudget (20 ms), and in a group a
//     question waits at most 2 ms for a lock and runs at most 20 ms
//     (questionGroupSetSQL), where a question alone waits 100 ms and runs
//     as long as it takes: past either, it is asked again alone in the
//     same call. So a group holds its targets' locks for about 40 ms at
//     most (its budget, and one question past its estimate); a DDL of a
//     target asked earlier in a group waits that long at most, not for
//     another target's lock wait or slow question (a group of 31 questions
//     of 9 ms each held its first target's lock 280 ms); and a user's
//     transaction that locks two targets' outboxes never waits on a group
//     for its deadlock_timeout (1 s), so its deadlock check cannot find
//     the group in a cycle (a group that waited 100 ms for one target
//     while holding another's made PostgreSQL abort the user's
//     transaction).
//   - Every group, a question alone too, runs READ COMMITTED whatever the
//     session's default: a repeatable read default (ALTER ROLE or ALTER
//     DATABASE) gave a group one snapshot, so a row committed while an
//     earlier question ran went unseen; a serializable read-only
//     deferrable default made a question wait for a safe snapshot as long
//     as another database's serializable transaction ran, and the whole
//     pipeline with it. A group starts with readCommittedSQL only on a
//     connection whose default is another (isolationOn): a pipeline's
//     implicit transaction is no transaction block, so the statement
//     works but logs a WARNING, at every group.
//   - A question's error aborts its group: the server skips the rest up
//     to the sync. askGrouped asks those again, each alone, in another
//     pipeline, so one target's dropped table fails its own question only,
//     and no question is sent more than twice a call (a question alone
//     is never skipped nor late). A target whose question failed, went
//     past the group's timeouts or took longer than emptySlow is asked
//     alone (a group of its own) next time too, until an answer is quick:
//     a target that keeps failing or is slow costs the others one round
//     trip, not a second one every round.

// questionGroup is the most questions that share an implicit transaction.
const questionGroup = 32

// groupBudget is how long a group's answers may take by their estimates
// (the answers' last times); askUnknown is the estimate for a target not
// answered yet (a first round asks groups of 4).
const (
	groupBudget = 20 * time.Millisecond
	askUnknown  = 5 * time.Millisecond
)

// questionGroupSetSQL is questionSetSQL for a group of more than one
// question: a 2 ms lock_timeout and a 20 ms statement_timeout (see above).
// A question's answer takes 16-60 us; one slow for dead rows (a held
// horizon) takes milliseconds, and is asked again alone.
const questionGroupSetSQL = `SELECT set_config('lock_timeout', '2ms', true), set_config('statement_timeout', '20ms', true),
	set_config('enable_seqscan', 'off', true), set_config('enable_bitmapscan', 'off', true)`

// readCommittedSQL starts every group on a connection whose default
// isolation is not READ COMMITTED: it takes no snapshot, so it may.
const readCommittedSQL = `SET TRANSACTION ISOLATION LEVEL READ COMMITTED`

// isolationOn keeps, per connection (*pgconn.PgConn), whether its
// session's default isolation is another than READ COMMITTED (key ""),
// read once (needsReadCommitted). The default is the role's and the
// database's, the same on every server connection a pooler hands out; a
// session that changes its own default later (SET on a pool's connection
// by the application) is not seen until the connection is replaced.
var isolationOn sync.Map

// needsReadCommitted reports whether pc's groups must start with
// readCommittedSQL: true unless pc's default isolation is READ COMMITTED
// (or when it could not be read). A connection error is returned. (SHOW
// takes no snapshot: a query would wait for a safe snapshot under a
// serializable read-only deferrable default.)
func needsReadCommitted(ctx context.Context, pc *pgconn.PgConn) (bool, error) {
	m := connSet[bool](&isolationOn, pc)
	if v, ok := m[""]; ok {
		return v, nil
	}
	res := pc.ExecParams(ctx, `SHOW default_transaction_isolation`, nil, nil, nil, nil).Read()
	if res.Err != nil {
		if !isPgError(res.Err) {
			return false, res.Err
		}
		return true, nil
	}
	v := len(res.Rows) != 1 || string(res.Rows[0][0]) != "read committed"
	m[""] = v
	return v, nil
}

// askGrouped asks rs their questions in one pipeline on pc, in groups as
// above: send queues relay i's question (and its prepare, if any), read
// reads its answers (the prepare's first), records the server's time on
// it in rs[i].askTook when it has it, and returns its error. It returns
// each question's error (nil: answered; a server's error), or an error
// of the connection (then the pipeline is closed).
func askGrouped(ctx context.Context, pc *pgconn.PgConn, rs []*Relay,
	send func(p *pgconn.Pipeline, i int), read func(p *pgconn.Pipeline, i int) error) ([]error, error) {
	errs := make([]error, len(rs))
	alone := make([]bool, len(rs)) // asked alone in this call
	late := make([]bool, len(rs))  // past a group's timeouts in this call
	est := make([]time.Duration, len(rs))
	for i, r := range rs {
		alone[i] = r.askAlone.Load()
		if est[i] = time.Duration(r.askTook.Load()); est[i] <= 0 {
			est[i] = askUnknown
		}
	}
	rc, err := needsReadCommitted(ctx, pc)
	if err != nil {
		return nil, err
	}
	todo := make([]int, len(rs))
	for i := range todo {
		todo[i] = i
	}
	for len(todo) > 0 {
		groups := groupQuestions(alone, est, todo)
		p := pc.StartPipeline(ctx)
		for _, g := range groups {
			if rc {
				p.SendQueryParams(readCommittedSQL, nil, nil, nil, nil)
			}
			if len(g) > 1 {
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
		for _, g := range groups {
			again, lateOne, err := readGroup(p, g, rc, read, errs)
			if err != nil {
				_ = p.Close()
				return nil, err
			}
			if lateOne >= 0 {
				late[lateOne] = true
			}
			for _, i := range again {
				alone[i] = true // skipped or late: asked again alone
			}
			todo = append(todo, again...)
		}
		if err := p.Close(); err != nil {
			return nil, err
		}
	}
	for i, r := range rs {
		r.askAlone.Store(errs[i] != nil || late[i] || time.Duration(r.askTook.Load()) > cmp.Or(r.emptySlow, emptySlow))
	}
	return errs, nil
}

// answeredIn records the server's time on the relay's last answered
// question: at least 1 ns, as an answer may take less than the
// microsecond the questions measure in, and 0 is "not answered yet".
func (r *Relay) answeredIn(took time.Duration) { r.askTook.Store(max(int64(took), 1)) }

// groupQuestions splits todo (indexes) into groups of at most
// questionGroup whose estimates add up to groupBudget at most (a group
// holds at least one), those asked alone in groups of their own.
func groupQuestions(alone []bool, est []time.Duration, todo []int) [][]int {
	var groups [][]int
	var cur []int
	var sum time.Duration
	for _, i := range todo {
		if alone[i] {
			groups = append(groups, []int{i})
			continue
		}
		if len(cur) > 0 && (len(cur) == questionGroup || sum+est[i] > groupBudget) {
			groups, cur, sum = append(groups, cur), nil, 0
		}
		cur, sum = append(cur, i), sum+est[i]
	}
	if len(cur) > 0 {
		groups = append(groups, cur)
	}
	return groups
}

// readGroup reads group g's answers: its setting statements' (rc:
// readCommittedSQL first), each
// question's through read (its error into errs), then the sync's. It
// returns the questions to ask again: the rest of the group, which the
// server skipped after a question's error, and in a group of more than
// one, first, the question that went past the group's timeouts
// (lock_timeout, statement_timeout or a cancel: its error not recorded),
// which late also names (-1: none). An error of a setting statement, or of
// the sync (the transaction's end), is every unanswered question's.
func readGroup(p *pgconn.Pipeline, g []int, rc bool, read func(p *pgconn.Pipeline, i int) error, errs []error) (again []int, late int, err error) {
	fail := func(err error) {
		for _, i := range g {
			if errs[i] == nil {
				errs[i] = err
			}
		}
	}
	settings := 1
	if rc {
		settings = 2 // readCommittedSQL's, then the settings'
	}
	var serr error
	for range settings {
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
