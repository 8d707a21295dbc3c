package harness

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"
)

// Proc is one OS process the harness runs, restarts and kills. Every start
// appends to the same log file (stdout and stderr), after a marker line.
type Proc struct {
	Name    string
	Path    string
	Args    []string
	Env     []string // added to the harness's environment
	LogPath string

	mu     sync.Mutex
	cmd    *exec.Cmd
	done   chan struct{}
	err    error // exit status of the last run, once done is closed
	starts int
}

// Start starts the process; it fails if it is already running.
func (p *Proc) Start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil && !isClosed(p.done) {
		return fmt.Errorf("%s: already running (pid %d)", p.Name, p.cmd.Process.Pid)
	}
	f, err := os.OpenFile(p.LogPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return fmt.Errorf("%s: log file: %w", p.Name, err)
	}
	p.starts++
	fmt.Fprintf(f, "=== harness: start #%d of %s at %s\n", p.starts, p.Name, time.Now().Format(time.RFC3339Nano))
	cmd := exec.Command(p.Path, p.Args...)
	cmd.Env = append(os.Environ(), p.Env...)
	cmd.Stdout, cmd.Stderr = f, f
	// Its own process group: a SIGINT to `go test` must not reach it first.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		f.Close()
		return fmt.Errorf("%s: start %s: %w", p.Name, p.Path, err)
	}
	done := make(chan struct{})
	p.cmd, p.done = cmd, done
	go func() {
		err := cmd.Wait()
		f.Close()
		p.mu.Lock()
		p.err = err
		p.mu.Unlock()
		close(done)
	}()
	return nil
}

// Pid is the running process's id, or 0.
func (p *Proc) Pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || isClosed(p.done) {
		return 0
	}
	return p.cmd.Process.Pid
}

// Running reports whether the process has been started and not exited.
func (p *Proc) Running() bool { return p.Pid() != 0 }

// Done returns a channel closed when the current run exits (nil if never
// started).
func (p *Proc) Done() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.done
}

// ExitErr is the last run's exit error (nil: exit 0 or still running).
func (p *Proc) ExitErr() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// Kill sends SIGKILL (a crash: no cleanup, no goodbye to Kafka or
// PostgreSQL) and waits for the exit.
func (p *Proc) Kill() error { return p.signalWait(syscall.SIGKILL, 10*time.Second) }

// Term sends SIGTERM and waits up to timeout, then SIGKILL.
func (p *Proc) Term(timeout time.Duration) error {
	if err := p.signalWait(syscall.SIGTERM, timeout); err == nil {
		return nil
	}
	return p.Kill()
}

// Pause stops the process (SIGSTOP): its sockets stay open, nothing answers.
func (p *Proc) Pause() error { return p.signal(syscall.SIGSTOP) }

// Resume continues a paused process (SIGCONT).
func (p *Proc) Resume() error { return p.signal(syscall.SIGCONT) }

// Signal sends sig to the running process.
func (p *Proc) Signal(sig syscall.Signal) error { return p.signal(sig) }

func (p *Proc) signal(sig syscall.Signal) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || isClosed(p.done) {
		return fmt.Errorf("%s: not running", p.Name)
	}
	if err := p.cmd.Process.Signal(sig); err != nil {
		return fmt.Errorf("%s: signal %v: %w", p.Name, sig, err)
	}
	return nil
}

func (p *Proc) signalWait(sig syscall.Signal, timeout time.Duration) error {
	done := p.Done()
	if done == nil || isClosed(done) {
		return nil
	}
	if err := p.signal(sig); err != nil && !isClosed(done) {
		return err
	}
	select {
	case <-done:
		return nil
	case <-time.After(timeout):
		return fmt.Errorf("%s: still running %s after %v", p.Name, timeout, sig)
	}
}

func isClosed(c <-chan struct{}) bool {
	if c == nil {
		return true
	}
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// errNotReady is returned by waits that time out.
var errNotReady = errors.New("not ready")
