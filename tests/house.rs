//! The house rules of `src/` (issue 43), checked on every run: rooms small enough to read, no
//! module that imports a sibling which imports it back, errors typed, every long-lived task
//! watched, and every source path the README and `docs/` cite is one that exists.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The most lines a file in `src/` may have outside its test modules.
const MOST_LINES: usize = 800;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every `.rs` file under `dir`, sorted.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = vec![];
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display())) {
            let path = entry.expect("dir entry").path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// The files of `src/` that are code, not tests: test-only modules (`#[cfg(test)] mod x;`, e.g.
/// the mock-API fixtures) left out.
fn src_files() -> Vec<PathBuf> {
    let all = rust_files(&root().join("src"));
    let mut test_only: Vec<PathBuf> = vec![];
    for f in &all {
        let text = std::fs::read_to_string(f).expect("read");
        let stem = f.file_stem().and_then(|s| s.to_str()).unwrap_or("");
        let dir = f.parent().map(Path::to_path_buf).unwrap_or_default();
        let module_dir = if ["mod", "lib", "main"].contains(&stem) {
            dir
        } else {
            dir.join(stem)
        };
        for m in test_only_modules(&text) {
            test_only.push(module_dir.join(format!("{m}.rs")));
            test_only.push(module_dir.join(m));
        }
    }
    all.into_iter()
        .filter(|f| !test_only.iter().any(|t| f.starts_with(t)))
        .collect()
}

/// A file's code outside `#[cfg(test)] mod … { … }` blocks, comments cut from each line.
fn code_of(text: &str) -> Vec<String> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = vec![];
    let mut i = 0;
    while i < lines.len() {
        let next = lines.get(i + 1).map(|l| l.trim_end()).unwrap_or("");
        if lines[i].trim() == "#[cfg(test)]" && next.contains("mod ") && next.ends_with('{') {
            i += 2;
            while i < lines.len() && lines[i] != "}" {
                i += 1;
            }
            i += 1;
            continue;
        }
        let line = lines[i];
        out.push(line.split("//").next().unwrap_or("").to_string());
        i += 1;
    }
    out
}

/// Modules declared test-only (`#[cfg(test)] mod name;`) in a file.
fn test_only_modules(text: &str) -> BTreeSet<String> {
    let lines: Vec<&str> = text.lines().collect();
    lines
        .windows(2)
        .filter(|w| w[0].trim() == "#[cfg(test)]")
        .filter_map(|w| {
            let l = w[1].trim().trim_start_matches("pub ");
            l.strip_prefix("mod ")?.strip_suffix(';').map(str::to_string)
        })
        .collect()
}

#[test]
fn no_file_in_src_is_over_800_lines_outside_its_tests() {
    let big: Vec<String> = src_files()
        .iter()
        .map(|p| (p, code_of(&std::fs::read_to_string(p).expect("read")).len()))
        .filter(|(_, n)| *n > MOST_LINES)
        .map(|(p, n)| format!("{} ({n} lines)", p.display()))
        .collect();
    assert!(
        big.is_empty(),
        "over {MOST_LINES} lines outside tests: {big:?}: split it by concept"
    );
}

#[test]
fn no_error_in_src_is_a_bare_string() {
    let mut found = vec![];
    for p in src_files() {
        let code = code_of(&std::fs::read_to_string(&p).expect("read")).join("\n");
        let flat: String = code.split_whitespace().collect::<Vec<_>>().join(" ");
        let mut rest = flat.as_str();
        while let Some(at) = rest.find("Result<") {
            rest = &rest[at + "Result<".len()..];
            if ends_with_string_error(rest) {
                found.push(p.display().to_string());
            }
        }
    }
    assert!(
        found.is_empty(),
        "Result<_, String> in {found:?}: give the error a thiserror type"
    );
}

/// The generic arguments from just after `Result<`: is the last top-level one `String`?
fn ends_with_string_error(args: &str) -> bool {
    let (mut depth, mut last_comma) = (0usize, None);
    for (i, c) in args.char_indices() {
        match c {
            '<' | '(' | '[' => depth += 1,
            ')' | ']' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => last_comma = Some(i),
            '>' if depth == 0 => {
                return last_comma.is_some_and(|at| args[at + 1..i].trim() == "String");
            }
            '>' => depth -= 1,
            _ => {}
        }
    }
    false
}

/// The direct child modules of a directory module and, per child, the siblings its code names.
fn sibling_imports(dir: &Path, path: &str, code_files: &[PathBuf]) -> BTreeMap<String, BTreeSet<String>> {
    let parent = ["mod.rs", "lib.rs"]
        .iter()
        .map(|f| dir.join(f))
        .find(|p| p.exists())
        .map(|p| std::fs::read_to_string(p).expect("read"))
        .unwrap_or_default();
    let test_only = test_only_modules(&parent);
    let mut children: BTreeMap<String, Vec<PathBuf>> = BTreeMap::new();
    for entry in std::fs::read_dir(dir).expect("read dir") {
        let p = entry.expect("entry").path();
        let name = p.file_stem().and_then(|s| s.to_str()).unwrap_or("").to_string();
        if ["mod", "lib", "main", "bin"].contains(&name.as_str()) || test_only.contains(&name) {
            continue;
        }
        let files: Vec<PathBuf> = code_files.iter().filter(|f| f.starts_with(&p)).cloned().collect();
        if !files.is_empty() {
            children.insert(name, files);
        }
    }
    let crate_prefix = if path.is_empty() {
        "crate::".to_string()
    } else {
        format!("crate::{path}::")
    };
    let mut edges = BTreeMap::new();
    for (name, files) in &children {
        let mut named = BTreeSet::new();
        for f in files {
            let text = std::fs::read_to_string(f).expect("read");
            let code = code_of(&text).join("\n");
            let direct = f == &dir.join(format!("{name}.rs")) || f == &dir.join(name).join("mod.rs");
            let mut prefixes = vec![crate_prefix.clone()];
            if direct {
                prefixes.push("super::".into());
            }
            for prefix in &prefixes {
                named.extend(modules_named(&code, prefix));
            }
        }
        named.retain(|n| n != name && children.contains_key(n));
        edges.insert(name.clone(), named);
    }
    edges
}

/// The first path segments after `prefix` (`prefix::x`, `prefix::{x, y::z}`), outside words
/// that merely end with it.
fn modules_named(code: &str, prefix: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = code;
    while let Some(at) = rest.find(prefix) {
        let before = rest[..at].chars().last();
        rest = &rest[at + prefix.len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
            continue;
        }
        if let Some(group) = rest.strip_prefix('{') {
            let inner = group.split('}').next().unwrap_or("");
            out.extend(inner.split(',').filter_map(first_segment));
        } else if let Some(s) = first_segment(rest) {
            out.insert(s);
        }
    }
    out
}

fn first_segment(s: &str) -> Option<String> {
    let word: String = s
        .trim_start()
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect();
    (!word.is_empty()).then_some(word)
}

/// A cycle among the nodes, if any (depth-first search).
fn a_cycle(edges: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        n: &str,
        edges: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|p| p == n) {
            return Some(path[at..].to_vec());
        }
        if done.contains(n) {
            return None;
        }
        path.push(n.to_string());
        for m in edges.get(n).into_iter().flatten() {
            if let Some(c) = visit(m, edges, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(n.to_string());
        None
    }
    let mut done = BTreeSet::new();
    edges.keys().find_map(|n| visit(n, edges, &mut vec![], &mut done))
}

#[test]
fn no_module_imports_a_sibling_that_imports_it_back() {
    let src = root().join("src");
    let code_files = src_files();
    let mut cycles = vec![];
    let mut dirs = vec![(src.clone(), String::new())];
    while let Some((dir, path)) = dirs.pop() {
        if let Some(c) = a_cycle(&sibling_imports(&dir, &path, &code_files)) {
            cycles.push(format!("{}: {}", dir.display(), c.join(" → ")));
        }
        for entry in std::fs::read_dir(&dir).expect("read dir") {
            let p = entry.expect("entry").path();
            if p.is_dir() && p.join("mod.rs").exists() {
                let name = p.file_name().and_then(|s| s.to_str()).unwrap_or("");
                let sub = if path.is_empty() {
                    name.to_string()
                } else {
                    format!("{path}::{name}")
                };
                dirs.push((p, sub));
            }
        }
    }
    assert!(cycles.is_empty(), "import cycles: {cycles:?}");
}

#[test]
fn the_cycle_finder_finds_a_cycle() {
    let edges: BTreeMap<String, BTreeSet<String>> = [
        ("a", vec!["b"]),
        ("b", vec!["c"]),
        ("c", vec!["a"]),
        ("d", vec!["a"]),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.into_iter().map(String::from).collect()))
    .collect();
    assert_eq!(a_cycle(&edges).map(|c| c.len()), Some(3));
    assert_eq!(
        modules_named(
            "use crate::{api, broker::x};\nlet a = crate::store::S;",
            "crate::"
        ),
        ["api", "broker", "store"].iter().map(|s| s.to_string()).collect()
    );
    assert!(ends_with_string_error("T, String> {"));
    assert!(!ends_with_string_error("Vec<String>, E> {"));
}

/// Every `tokio::spawn` in `src/` outside the supervisor says, just above it, how the task is
/// watched (`// Supervision: …`): a long-lived task that nobody watches is how a pod stays
/// Ready with its work dead.
#[test]
fn every_spawned_task_says_how_it_is_supervised() {
    let mut unwatched = vec![];
    for p in src_files() {
        if p.ends_with("supervisor.rs") {
            continue;
        }
        let code = code_of(&std::fs::read_to_string(&p).expect("read"));
        let text = std::fs::read_to_string(&p).expect("read");
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            let live = code
                .iter()
                .any(|c| c.trim() == line.split("//").next().unwrap_or("").trim());
            if !line.contains("tokio::spawn(") || !live || line.trim_start().starts_with("//") {
                continue;
            }
            let above = &lines[i.saturating_sub(4)..i];
            if !above.iter().any(|l| l.contains("// Supervision:")) {
                unwatched.push(format!("{}:{}", p.display(), i + 1));
            }
        }
    }
    assert!(
        unwatched.is_empty(),
        "spawned without saying how it is supervised (register it with src/supervisor.rs, or write `// Supervision: <who notices its end>` above it): {unwatched:?}"
    );
}

/// Every `src/…` path the README and `docs/` cite exists: a newcomer who follows one finds it.
#[test]
fn every_source_path_the_docs_cite_exists() {
    let mut docs = vec![root().join("README.md")];
    docs.extend(
        std::fs::read_dir(root().join("docs"))
            .expect("docs/")
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "md")),
    );
    let mut missing = vec![];
    for doc in docs {
        let text = std::fs::read_to_string(&doc).expect("read");
        for cited in text
            .split('`')
            .filter(|s| s.starts_with("src/") && !s.contains(' '))
        {
            let path = cited
                .split(['#', ':'])
                .next()
                .unwrap_or(cited)
                .trim_end_matches('/');
            if !root().join(path).exists() {
                missing.push(format!("{}: {cited}", doc.display()));
            }
        }
    }
    assert!(missing.is_empty(), "cited but not there: {missing:?}");
}
