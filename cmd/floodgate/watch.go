package main

import (
	"crypto/sha256"
	"io"
	"log/slog"
	"maps"
	"os"
	"slices"
	"time"

	"github.com/floodgate/floodgate/internal/server/config"
)

// fileState is what the watcher compares of one rules file.
type fileState struct {
	fi  os.FileInfo // for os.SameFile: a rename puts a new file in place
	sum [sha256.Size]byte
}

func (a fileState) same(b fileState) bool {
	return a.fi.Size() == b.fi.Size() && a.fi.ModTime().Equal(b.fi.ModTime()) && a.sum == b.sum && os.SameFile(a.fi, b.fi)
}

// snapshot is the state of every file of a rules path, by path.
type snapshot map[string]fileState

func (s snapshot) same(o snapshot) bool {
	return s != nil && o != nil && maps.EqualFunc(s, o, fileState.same)
}

// replaces reports whether s replaced prev by renames: every file that
// changed is a new file in place of its old one (an atomic rename, a
// Kubernetes ConfigMap's symlink swap), whose content was complete before
// it appeared, and none went.
func (s snapshot) replaces(prev snapshot) bool {
	changed := false
	for p, old := range prev {
		now, ok := s[p]
		if !ok {
			return false
		}
		if !now.same(old) {
			if os.SameFile(now.fi, old.fi) {
				return false // written in place
			}
			changed = true
		}
	}
	return changed
}

// scan reads the state of the rules file, or of every file of the rules
// directory, at path. A file's content is hashed only when its size, time
// or identity differs from prev's: an unchanged file is not read again.
func scan(path string, prev snapshot) (snapshot, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	files := []string{path}
	if fi.IsDir() {
		if files, err = config.Files(path); err != nil {
			return nil, err
		}
	}
	s := make(snapshot, len(files))
	for _, f := range files {
		fi, err := os.Stat(f)
		if err != nil {
			return nil, err
		}
		st := fileState{fi: fi}
		if old, ok := prev[f]; ok && old.fi.Size() == fi.Size() && old.fi.ModTime().Equal(fi.ModTime()) && os.SameFile(old.fi, fi) {
			st.sum = old.sum
		} else if st.sum, err = hashFile(f); err != nil {
			return nil, err
		}
		s[f] = st
	}
	return s, nil
}

func hashFile(path string) ([sha256.Size]byte, error) {
	var sum [sha256.Size]byte
	f, err := os.Open(path)
	if err != nil {
		return sum, err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return sum, err
	}
	copy(sum[:], h.Sum(nil))
	return sum, nil
}

// watcher decides when a changed rules file is reloaded. A file is
// reloaded only once it is settled: the same (size, time, identity and
// content) at two polls at least settle apart. A settled file that fails
// to load is reported once, and the rules in use stay. A settled file
// that drops rules or domains in use (as one cut short by a writer still
// writing, or one that stopped, would) is reloaded only when the drop is
// deliberate: the files were replaced by renames, which publish a whole
// file at once, or they have stayed the same for removeSettle; meanwhile
// the watcher logs, once, what it holds back. SIGHUP (reload) is always
// deliberate.
type watcher struct {
	path                 string
	settle, removeSettle time.Duration
	log                  *slog.Logger
	// load reads the rules; apply swaps them in (or reports err); current
	// returns the rules in use.
	load    func() (*config.Config, error)
	apply   func(cfg *config.Config, err error)
	current func() *config.Config

	applied snapshot  // the files as last reloaded (or refused)
	pending snapshot  // a change seen, not yet reloaded
	since   time.Time // when pending was first seen
	held    bool      // the hold of pending's drop was logged
}

// poll looks at the files at now and reloads them when they are settled.
func (w *watcher) poll(now time.Time) {
	s, err := scan(w.path, w.known())
	if err != nil {
		return // gone for a moment (a rename of a directory): look again
	}
	if s.same(w.applied) {
		w.pending = nil
		return
	}
	if !s.same(w.pending) {
		w.pending, w.since, w.held = s, now, false
		return
	}
	if now.Sub(w.since) < w.settle {
		return
	}
	cfg, err := w.load()
	if err == nil {
		if dropped := droppedNames(w.current(), cfg); len(dropped) > 0 && !s.replaces(w.applied) && now.Sub(w.since) < w.removeSettle {
			if !w.held {
				w.held = true
				w.log.Warn("floodgate: the rules file drops rules in use; reloading it once it has stayed the same for a while, or at SIGHUP",
					"file", w.path, "dropped", dropped, "after", w.removeSettle.String())
			}
			return
		}
	}
	w.apply(cfg, err)
	w.applied, w.pending = s, nil
}

// known is the last snapshot seen, whose hashes scan may reuse.
func (w *watcher) known() snapshot {
	if w.pending != nil {
		return w.pending
	}
	return w.applied
}

// reload reloads the files now, whatever they hold: SIGHUP.
func (w *watcher) reload() {
	s, _ := scan(w.path, w.known())
	cfg, err := w.load()
	w.apply(cfg, err)
	w.applied, w.pending = s, nil
}

// droppedNames returns the rules and domains of old that cfg lacks.
func droppedNames(old, cfg *config.Config) []string {
	var out []string
	for _, r := range old.Rules {
		if _, ok := cfg.Rule(r.Name); !ok {
			out = append(out, "rule "+r.Name)
		}
	}
	for name := range old.Domains {
		if _, ok := cfg.Domains[name]; !ok {
			out = append(out, "domain "+name)
		}
	}
	slices.Sort(out)
	return out
}

// run polls every interval until stop is closed, and reloads at once at
// each value of hup.
func (w *watcher) run(interval time.Duration, stop <-chan struct{}, hup <-chan struct{}) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-hup:
			w.reload()
		case now := <-t.C:
			w.poll(now)
		}
	}
}
