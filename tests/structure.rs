//! The code's shape cannot drift: no import circle in the crate or in testenv (between files, and
//! between modules taken whole with everything under them), and no I/O in the modules that
//! decide (no `async`, no `.await`). It only reads the sources: no control plane, no network.
//!
//! A module's dependencies are every path it names through `crate::`, `super::`, `self::` or a
//! child module, followed through `pub use` re-exports to where the item lives. Declaring a child
//! (`mod x;`) is not a dependency; using what it defines is.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::LazyLock;

use regex::Regex;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

type Module = Vec<String>;

// The patterns the reader uses, compiled once.
static COMMENTS: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"//[^\n]*").unwrap());
static STRINGS: LazyLock<Regex> = LazyLock::new(|| Regex::new(r#""(?:\\.|[^"\\])*""#).unwrap());
static VISIBILITY: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"pub\(in [^)]*\)").unwrap());
static INLINE_MOD: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"\bmod\s+\w+\s*\{").unwrap());
static USE_TREE: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"^[\w\s:{},*]+$").unwrap());
static REEXPORT: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"\bpub\s+use\s+([^;]+);").unwrap());
static USES: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"\buse\s+([^;]+);").unwrap());
static PATHS: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"\b((?:crate|super|self)(?:::\w+)+)").unwrap());
static CHILD_PATHS: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"(?:^|[^:\w])(\w+)::(\w+)").unwrap());

/// The modules that decide, and a reconcile's snapshot of a pool's Pods: pure, tested with plain
/// values. A reconcile's I/O is in `controller/observe/` and `controller/act/`, through the
/// context's clients (`controller/context.rs`, `controller/worker_http.rs`).
const PURE: &[&str] = &[
    "src/sizing",
    "src/controller/rollout",
    "src/controller/state",
    "src/controller/deployments.rs",
    "src/controller/status.rs",
    "src/controller/cached_pod.rs",
    "src/controller/protocol.rs",
    "src/controller/settings.rs",
    "src/controller/cut.rs",
    "src/controller/triggers.rs",
    "src/controller/pool_index.rs",
    "src/controller/pods",
    "src/controller/plan",
    "src/controller/worker.rs",
];

struct Crate {
    files: BTreeMap<Module, PathBuf>,
    /// Each module's code with comments, strings and visibility paths taken out.
    code: BTreeMap<Module, String>,
    /// Names a module re-exports (`pub use`), and the module each comes from.
    reexports: BTreeMap<Module, BTreeMap<String, Module>>,
    edges: BTreeMap<Module, BTreeSet<Module>>,
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|e| e.expect("a directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The module a file holds: `a/b.rs` and `a/b/mod.rs` are `a::b`, `lib.rs` the crate. Binaries
/// (`main.rs`, `bin/`) are crates of their own and left out.
fn module_of(root: &Path, file: &Path) -> Option<Module> {
    let relative = file.strip_prefix(root).ok()?.with_extension("");
    let mut parts: Module = relative
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if parts.first().is_some_and(|p| p == "bin") || parts == ["main"] {
        return None;
    }
    if parts.last().is_some_and(|p| p == "mod") || parts == ["lib"] {
        parts.pop();
    }
    Some(parts)
}

/// The code without comments, string literals and `pub(in …)` paths; inside an inline module
/// (`mod tests { … }`), `super::` names the file's own module.
fn code_of(text: &str) -> String {
    let text = COMMENTS.replace_all(text, "");
    let text = STRINGS.replace_all(&text, "\"\"");
    let text = VISIBILITY.replace_all(&text, "pub").into_owned();
    let mut out = String::new();
    let mut at = 0;
    for found in INLINE_MOD.find_iter(&text) {
        if found.start() < at {
            continue;
        }
        let mut depth = 0;
        let mut end = text.len();
        for (i, c) in text[found.end() - 1..].char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = found.end() - 1 + i;
                        break;
                    }
                }
                _ => {}
            }
        }
        out.push_str(&text[at..found.end()]);
        out.push_str(&text[found.end()..end].replace("super::", "self::"));
        at = end;
    }
    out.push_str(&text[at..]);
    out
}

/// The paths one `use` tree names: `a::{b, c::{d, e as f}}` is `a::b`, `a::c::d`, `a::c::e`.
fn use_paths(tree: &str) -> Vec<Vec<String>> {
    fn walk(prefix: &[String], tree: &str, out: &mut Vec<Vec<String>>) {
        let tree = tree.trim();
        if let Some(open) = tree.find('{') {
            let mut prefix = prefix.to_vec();
            prefix.extend(
                tree[..open]
                    .split("::")
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(str::to_owned),
            );
            let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
            let (mut depth, mut start) = (0, 0);
            for (i, c) in inner.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        walk(&prefix, &inner[start..i], out);
                        start = i + 1;
                    }
                    _ => {}
                }
            }
            walk(&prefix, &inner[start..], out);
        } else if !tree.is_empty() {
            let tree = tree.split(" as ").next().unwrap_or(tree);
            let mut path = prefix.to_vec();
            path.extend(
                tree.split("::")
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(str::to_owned),
            );
            out.push(path);
        }
    }
    // Only a use tree: `use` in text the string filter missed (a raw string, a char) is not one.
    let mut out = Vec::new();
    if USE_TREE.is_match(tree) && tree.matches('{').count() == tree.matches('}').count() {
        walk(&[], tree, &mut out);
    }
    out
}

impl Crate {
    fn read(root: &Path) -> Self {
        let mut paths = Vec::new();
        rust_files(root, &mut paths);
        let files: BTreeMap<Module, PathBuf> = paths
            .into_iter()
            .filter_map(|p| Some((module_of(root, &p)?, p)))
            .collect();
        let code = files
            .iter()
            .map(|(m, p)| (m.clone(), code_of(&std::fs::read_to_string(p).unwrap())))
            .collect();
        let mut krate = Crate {
            files,
            code,
            reexports: BTreeMap::new(),
            edges: BTreeMap::new(),
        };
        krate.find_reexports();
        krate.find_edges();
        krate
    }

    /// `path` (from `crate`, `super`, `self` or a child of `from`) as the module it reaches and
    /// what is left of it; `None` for a path into another crate.
    fn resolve(&self, from: &Module, path: &[String]) -> Option<(Module, Vec<String>)> {
        let (mut module, mut rest) = match path.first().map(String::as_str) {
            Some("crate") => (Vec::new(), &path[1..]),
            Some("super" | "self") => {
                let mut base = from.clone();
                let mut rest = path;
                while let Some(first) = rest.first() {
                    match first.as_str() {
                        "super" => {
                            base.pop();
                        }
                        "self" => {}
                        _ => break,
                    }
                    rest = &rest[1..];
                }
                (base, rest)
            }
            Some(child) => {
                let mut child_module = from.clone();
                child_module.push(child.to_owned());
                if !self.files.contains_key(&child_module) {
                    return None;
                }
                (from.clone(), path)
            }
            None => return None,
        };
        while let Some(next) = rest.first() {
            let mut deeper = module.clone();
            deeper.push(next.clone());
            if !self.files.contains_key(&deeper) {
                break;
            }
            module = deeper;
            rest = &rest[1..];
        }
        Some((module, rest.to_vec()))
    }

    /// Where an item named through `module` lives, following re-exports.
    fn home(&self, mut module: Module, mut rest: Vec<String>) -> Module {
        for _ in 0..10 {
            let Some(next) = rest
                .first()
                .and_then(|name| self.reexports.get(&module)?.get(name))
            else {
                break;
            };
            module = next.clone();
            rest.remove(0);
        }
        module
    }

    fn find_reexports(&mut self) {
        let mut found: BTreeMap<Module, BTreeMap<String, Module>> = BTreeMap::new();
        for (module, code) in &self.code {
            for tree in REEXPORT.captures_iter(code) {
                for path in use_paths(&tree[1]) {
                    if let Some((home, rest)) = self.resolve(module, &path)
                        && let Some(name) = rest.last()
                    {
                        found
                            .entry(module.clone())
                            .or_default()
                            .insert(name.clone(), home);
                    }
                }
            }
        }
        self.reexports = found;
    }

    fn find_edges(&mut self) {
        let mut edges: BTreeMap<Module, BTreeSet<Module>> = BTreeMap::new();
        for (module, code) in &self.code {
            let mut named: Vec<Vec<String>> = USES
                .captures_iter(code)
                .flat_map(|c| use_paths(&c[1]))
                .collect();
            named.extend(
                PATHS
                    .captures_iter(code)
                    .map(|c| c[1].split("::").map(str::to_owned).collect()),
            );
            named.extend(
                CHILD_PATHS
                    .captures_iter(code)
                    .filter(|c| !matches!(&c[1], "crate" | "super" | "self"))
                    .map(|c| vec![c[1].to_owned(), c[2].to_owned()]),
            );
            for path in named {
                if let Some((to, rest)) = self.resolve(module, &path) {
                    let to = self.home(to, rest);
                    if &to != module {
                        edges.entry(module.clone()).or_default().insert(to);
                    }
                }
            }
        }
        self.edges = edges;
    }

    fn name(module: &Module) -> String {
        if module.is_empty() {
            "crate".into()
        } else {
            module.join("::")
        }
    }

    /// Every circle: between files, then between the children of each module taken whole.
    fn circles(&self) -> Vec<String> {
        let mut found = Vec::new();
        for circle in strongly_connected(&self.edges) {
            found.push(format!("files: {}", self.explain(&circle, &self.edges)));
        }
        let mut wholes: BTreeMap<Module, BTreeMap<Module, BTreeSet<Module>>> = BTreeMap::new();
        for (from, tos) in &self.edges {
            for to in tos {
                let shared = from.iter().zip(to).take_while(|(a, b)| a == b).count();
                let parent: Module = from[..shared].to_vec();
                let side = |m: &Module| m[..(shared + 1).min(m.len())].to_vec();
                let (a, b) = (side(from), side(to));
                if a != b {
                    wholes
                        .entry(parent)
                        .or_default()
                        .entry(a)
                        .or_default()
                        .insert(b);
                }
            }
        }
        for graph in wholes.values() {
            for circle in strongly_connected(graph) {
                found.push(format!(
                    "modules taken whole: {}",
                    self.explain(&circle, graph)
                ));
            }
        }
        found
    }

    fn explain(&self, circle: &[Module], graph: &BTreeMap<Module, BTreeSet<Module>>) -> String {
        let members: BTreeSet<&Module> = circle.iter().collect();
        let mut parts = Vec::new();
        for from in circle {
            for to in graph.get(from).into_iter().flatten() {
                if members.contains(to) {
                    parts.push(format!("{} → {}", Self::name(from), Self::name(to)));
                }
            }
        }
        parts.join(", ")
    }
}

/// The strongly connected sets of more than one module (Tarjan's algorithm).
fn strongly_connected(graph: &BTreeMap<Module, BTreeSet<Module>>) -> Vec<Vec<Module>> {
    struct Walk<'g> {
        graph: &'g BTreeMap<Module, BTreeSet<Module>>,
        index: BTreeMap<&'g Module, usize>,
        low: BTreeMap<&'g Module, usize>,
        stack: Vec<&'g Module>,
        on_stack: BTreeSet<&'g Module>,
        found: Vec<Vec<Module>>,
    }
    impl<'g> Walk<'g> {
        fn visit(&mut self, v: &'g Module) {
            let i = self.index.len();
            self.index.insert(v, i);
            self.low.insert(v, i);
            self.stack.push(v);
            self.on_stack.insert(v);
            for w in self.graph.get(v).into_iter().flatten() {
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let low = self.low[v].min(self.low[w]);
                    self.low.insert(v, low);
                } else if self.on_stack.contains(w) {
                    let low = self.low[v].min(self.index[w]);
                    self.low.insert(v, low);
                }
            }
            if self.low[v] == self.index[v] {
                let mut set = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack.remove(w);
                    set.push(w.clone());
                    if w == v {
                        break;
                    }
                }
                if set.len() > 1 {
                    set.sort();
                    self.found.push(set);
                }
            }
        }
    }
    let mut walk = Walk {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for v in graph.keys() {
        if !walk.index.contains_key(v) {
            walk.visit(v);
        }
    }
    walk.found
}

fn assert_no_circles(dir: &str) {
    let krate = Crate::read(&Path::new(ROOT).join(dir));
    assert!(
        krate.edges.len() > 5,
        "{dir}: the dependency reader found almost nothing"
    );
    let circles = krate.circles();
    assert!(
        circles.is_empty(),
        "{dir} has import circles:\n{}",
        circles.join("\n")
    );
}

#[test]
fn the_crate_depends_one_way() {
    assert_no_circles("src");
}

#[test]
fn testenv_depends_one_way() {
    assert_no_circles("testenv/src");
}

#[test]
fn the_modules_that_decide_do_no_io() {
    let asynchronous = Regex::new(r"\basync\b|\.await\b").unwrap();
    let mut found = Vec::new();
    for pure in PURE {
        let path = Path::new(ROOT).join(pure);
        let mut files = Vec::new();
        if path.is_dir() {
            rust_files(&path, &mut files);
        } else {
            files.push(path);
        }
        for file in files {
            let code = code_of(&std::fs::read_to_string(&file).unwrap());
            if let Some(at) = asynchronous.find(&code) {
                found.push(format!("{}: `{}`", file.display(), at.as_str()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "I/O where only decisions belong:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_reader_finds_a_circle_it_is_shown() {
    let dir = std::env::temp_dir().join(format!("lanepool-structure-{}", std::process::id()));
    let write = |path: &str, text: &str| {
        let path = dir.join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    };
    write("lib.rs", "mod a;\nmod b;\npub mod c;\npub use c::Thing;\n");
    write("a.rs", "use crate::b::f;\npub fn g() { f() }\n");
    write("b.rs", "pub fn f() { super::a::g() }\n");
    write("c/mod.rs", "mod d;\npub use d::Thing;\npub fn h() {}\n");
    write("c/d.rs", "pub struct Thing;\nfn k() { super::h() }\n");
    let krate = Crate::read(&dir);
    let circles = krate.circles();
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(
        circles
            .iter()
            .any(|c| c.contains("a → b") && c.contains("b → a")),
        "{circles:?}"
    );
    // c re-exports d's Thing (followed to d) but d uses c's own h: a circle of a parent and
    // its child.
    assert!(
        circles
            .iter()
            .any(|c| c.contains("c → c::d") && c.contains("c::d → c")),
        "{circles:?}"
    );
}
