//! The documentation cannot drift from the code or from itself: every field of the checked-in
//! CRD is named in docs/reference.md and every field named there is in the CRD, every relative
//! link in README.md and docs/*.md reaches a file and, with `#anchor`, a heading, and the two
//! Prometheus examples scrape the same targets with the labels and interval the operator reads.
//! It only reads files: no control plane, no network.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde_yaml::Value;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const CRD: &str = "crds/lanepool.dev_lanepools.yaml";
const REFERENCE: &str = "docs/reference.md";

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// The markdown files whose links are checked: the README and every page of docs/.
fn markdown_files() -> Vec<PathBuf> {
    let root = Path::new(ROOT);
    let mut files = vec![root.join("README.md")];
    let mut pages: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("docs/ exists")
        .map(|entry| entry.expect("a docs/ entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "md"))
        .collect();
    pages.sort();
    files.extend(pages);
    files
}

/// The text outside fenced code blocks: a `#` or a `](` inside a shell or YAML example is
/// neither a heading nor a link.
fn prose(markdown: &str) -> Vec<&str> {
    let mut fenced = false;
    let mut lines = Vec::new();
    for line in markdown.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced {
            lines.push(line);
        }
    }
    lines
}

// ---------------------------------------------------------------------------------------------
// Every field of the CRD, and only those, in docs/reference.md.

/// The dotted paths of every field under `schema`'s properties: `spec.lanes[].reserve.max`.
/// An array's items add `[]`; the pod template is the one object not descended into (it is a
/// core/v1 PodTemplateSpec, documented by Kubernetes).
fn field_paths(schema: &Value, path: &str, paths: &mut BTreeSet<String>) {
    if let Some(properties) = schema.get("properties").and_then(Value::as_mapping) {
        for (name, field) in properties {
            let name = name.as_str().expect("a property name is a string");
            let field_path = format!("{path}.{name}");
            paths.insert(field_path.clone());
            if field_path != "spec.template" {
                field_paths(field, &field_path, paths);
            }
        }
    }
    if let Some(items) = schema.get("items") {
        field_paths(items, &format!("{path}[]"), paths);
    }
}

/// Every spec and status field of the checked-in CRD's (only) version.
fn crd_fields() -> BTreeSet<String> {
    let crd: Value = serde_yaml::from_str(&read(&Path::new(ROOT).join(CRD))).expect("CRD YAML");
    let versions = crd["spec"]["versions"].as_sequence().expect("versions");
    assert_eq!(versions.len(), 1, "one served version, v1alpha1");
    let schema = &versions[0]["schema"]["openAPIV3Schema"]["properties"];
    let mut paths = BTreeSet::new();
    for top in ["spec", "status"] {
        assert!(schema.get(top).is_some(), "the CRD has {top}");
        field_paths(&schema[top], top, &mut paths);
    }
    paths
}

/// Inline code spans of the prose that look like a field path (`spec.…` or `status.…`): what
/// the reference claims the CRD has.
fn documented_fields(markdown: &str) -> BTreeSet<String> {
    let text = prose(markdown).join("\n");
    text.split('`')
        .skip(1)
        .step_by(2)
        .filter(|span| span.starts_with("spec.") || span.starts_with("status."))
        .filter(|span| {
            span.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '[' | ']'))
        })
        .map(str::to_string)
        .collect()
}

#[test]
fn the_crd_walk_finds_nested_fields_and_stops_at_the_pod_template() {
    let fields = crd_fields();
    for nested in [
        "spec.lanes",
        "spec.lanes[].name",
        "spec.lanes[].reserve.max",
        "spec.lanes[].reserve.jobTime.fallback",
        "spec.prometheus.basicAuth.passwordSecret.key",
        "spec.template",
        "status.lanes[].recommendedReserve",
        "status.conditions[].lastTransitionTime",
    ] {
        assert!(fields.contains(nested), "the walk misses {nested}");
    }
    let inside_template: Vec<_> = fields
        .iter()
        .filter(|f| f.starts_with("spec.template."))
        .collect();
    assert!(inside_template.is_empty(), "{inside_template:?}");
}

#[test]
fn every_crd_field_is_in_the_reference() {
    let documented = documented_fields(&read(&Path::new(ROOT).join(REFERENCE)));
    let missing: Vec<_> = crd_fields().difference(&documented).cloned().collect();
    assert!(
        missing.is_empty(),
        "fields of {CRD} that {REFERENCE} does not name (as `spec.…` or `status.…`): {missing:#?}"
    );
}

/// The `.rs` files under `dir`, recursively.
fn rust_files(dir: &Path, files: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("a source directory") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            rust_files(&path, files);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            files.push(path);
        }
    }
}

/// The reasons of the events the operator writes: each literal one
/// (`ctx.event(pool, EventType::Normal, "Scaled", …)`), the reasons of a failed reconcile
/// (`Error::reason`) but `NotLeader`, which the write fence keeps from being published, and the
/// warning conditions' reasons that are also events, and `WorkersCannotStart` (a constant).
fn event_reasons() -> BTreeSet<String> {
    let literal = regex::Regex::new(r#"EventType::(?:Normal|Warning),\s*"(\w+)""#).unwrap();
    let mut files = Vec::new();
    rust_files(&Path::new(ROOT).join("src/controller"), &mut files);
    let mut reasons: BTreeSet<String> = files
        .iter()
        .flat_map(|file| {
            let text = read(file);
            literal
                .captures_iter(&text)
                .map(|c| c[1].to_string())
                .collect::<Vec<_>>()
        })
        .collect();
    let error = read(&Path::new(ROOT).join("src/error.rs"));
    let body = error
        .split("pub fn reason(&self)")
        .nth(1)
        .and_then(|rest| rest.split("\n    }\n").next())
        .expect("Error::reason in src/error.rs");
    let arm = regex::Regex::new(r#"=>\s*\{?\s*"(\w+)""#).unwrap();
    reasons.extend(arm.captures_iter(body).map(|c| c[1].to_string()));
    reasons.remove("NotLeader");
    reasons.extend(
        [
            "JobLongerThanGracePeriod",
            "TotalBelowReserves",
            "WorkersCannotStart",
        ]
        .map(String::from),
    );
    reasons
}

#[test]
fn every_event_reason_the_operator_writes_is_in_the_reference() {
    let reasons = event_reasons();
    for known in ["Scaled", "Draining", "StandingIn", "MissingSecret"] {
        assert!(
            reasons.contains(known),
            "{known} not found in the code: {reasons:?}"
        );
    }
    let reference = read(&Path::new(ROOT).join(REFERENCE));
    let table = reference
        .split("### Events\n")
        .nth(1)
        .and_then(|rest| rest.split("\n## ").next())
        .expect("docs/reference.md has an Events section");
    let missing: Vec<&String> = reasons
        .iter()
        .filter(|reason| !table.contains(&format!("`{reason}`")))
        .collect();
    assert!(
        missing.is_empty(),
        "event reasons missing from the reference's Events table: {missing:?}"
    );
}

#[test]
fn the_reference_names_no_field_the_crd_lacks() {
    let documented = documented_fields(&read(&Path::new(ROOT).join(REFERENCE)));
    let unknown: Vec<_> = documented.difference(&crd_fields()).cloned().collect();
    assert!(
        unknown.is_empty(),
        "fields {REFERENCE} names that {CRD} does not have: {unknown:#?}"
    );
}

// ---------------------------------------------------------------------------------------------
// Every relative link resolves.

/// GitHub's anchor for a heading: lower case, punctuation dropped (letters, digits, `-`, `_`
/// and spaces kept), each space a `-`.
fn github_anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a markdown file's headings; a repeated heading gets `-1`, `-2`, … as on GitHub.
fn anchors(markdown: &str) -> BTreeSet<String> {
    let mut anchors = BTreeSet::new();
    for line in prose(markdown) {
        let hashes = line.chars().take_while(|&c| c == '#').count();
        if !(1..=6).contains(&hashes) || !line[hashes..].starts_with(' ') {
            continue;
        }
        let anchor = github_anchor(&line[hashes..]);
        let unique = (0..)
            .map(|n| {
                if n == 0 {
                    anchor.clone()
                } else {
                    format!("{anchor}-{n}")
                }
            })
            .find(|candidate| !anchors.contains(candidate))
            .expect("some suffix is free");
        anchors.insert(unique);
    }
    anchors
}

/// The targets of inline links and images, `[text](target)`, outside code: fenced blocks and
/// inline spans (a pattern such as `([-a-z]*[a-z])` is not a link).
fn link_targets(markdown: &str) -> Vec<String> {
    let text = prose(markdown).join("\n");
    let mut targets = Vec::new();
    for outside_code in text.split('`').step_by(2) {
        let mut rest = outside_code;
        while let Some(start) = rest.find("](") {
            let tail = &rest[start + 2..];
            let end = tail.find(')').unwrap_or(tail.len());
            let target = tail[..end].split_whitespace().next().unwrap_or("");
            targets.push(target.to_string());
            rest = &tail[end..];
        }
    }
    targets
}

fn is_relative(target: &str) -> bool {
    !(target.contains("://") || target.starts_with("mailto:"))
}

/// Why `target`, linked from `file`, does not resolve; `None` when it does.
fn broken(file: &Path, target: &str) -> Option<String> {
    let (path, anchor) = match target.split_once('#') {
        Some((path, anchor)) => (path, Some(anchor)),
        None => (target, None),
    };
    let linked = if path.is_empty() {
        file.to_path_buf()
    } else {
        file.parent().expect("a file has a directory").join(path)
    };
    let shown = linked.strip_prefix(ROOT).unwrap_or(&linked).display();
    if !linked.exists() {
        return Some(format!("no file {shown}"));
    }
    let anchor = anchor?;
    if linked.extension().is_none_or(|ext| ext != "md") {
        return Some("an anchor into a file that is not markdown".into());
    }
    let headings = anchors(&read(&linked));
    (!headings.contains(anchor)).then(|| format!("no heading #{anchor} in {shown}"))
}

#[test]
fn github_anchors_follow_githubs_rules() {
    assert_eq!(github_anchor(" How it sizes"), "how-it-sizes");
    assert_eq!(github_anchor("The suite: `--suite`"), "the-suite---suite");
    assert_eq!(github_anchor("1. Measure"), "1-measure");
    assert_eq!(github_anchor("The demo's parts"), "the-demos-parts");
    assert_eq!(
        github_anchor("Scale-downs: idle workers first, drained workers"),
        "scale-downs-idle-workers-first-drained-workers"
    );
    let repeated = anchors("# Scale\n```sh\n# not a heading\n```\n## Scale\n#hashtag\n");
    assert_eq!(repeated, BTreeSet::from(["scale".into(), "scale-1".into()]));
}

#[test]
fn links_are_found_outside_code_only() {
    let markdown = "see [a](docs/a.md#x) and ![b](b.png \"t\") or [c](https://x.dev)\n\
                    a pattern `^[a-z]([-a-z]*[a-z])?$` is code\n\
                    ```yaml\nnot: [a](link.md)\n```\n";
    assert_eq!(
        link_targets(markdown),
        ["docs/a.md#x", "b.png", "https://x.dev"]
    );
}

#[test]
fn every_relative_link_resolves() {
    let files = markdown_files();
    assert!(files.len() > 1, "README.md and the pages of docs/");
    let mut checked = 0;
    let mut broken_links = Vec::new();
    for file in &files {
        for target in link_targets(&read(file)) {
            if !is_relative(&target) {
                continue;
            }
            checked += 1;
            if let Some(why) = broken(file, &target) {
                let shown = file.strip_prefix(ROOT).unwrap_or(file);
                broken_links.push(format!("{}: ({target}) {why}", shown.display()));
            }
        }
    }
    assert!(
        checked > 0,
        "no relative link found: the link parser is broken"
    );
    assert!(
        broken_links.is_empty(),
        "broken links:\n{}",
        broken_links.join("\n")
    );
}

// ---------------------------------------------------------------------------------------------
// The Prometheus examples scrape what the operator reads, and agree with each other.

/// Reads an example's YAML.
fn example(path: &str) -> Value {
    serde_yaml::from_str(&read(&Path::new(ROOT).join(path)))
        .unwrap_or_else(|e| panic!("{path} is YAML: {e}"))
}

/// A Pod label as Prometheus's Kubernetes discovery names it: each character that is not a
/// letter, a digit or `_` becomes `_`.
fn discovered(label: &str) -> String {
    label
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

/// The operator's default `--scrape-interval`, as its flags declare it.
fn default_scrape_interval() -> String {
    use clap::Args as _;
    let run = lanepool::run::RunArgs::augment_args(clap::Command::new("run"));
    let flag = run
        .get_arguments()
        .find(|arg| arg.get_long() == Some("scrape-interval"))
        .expect("lanepool run --scrape-interval");
    let default = flag.get_default_values();
    assert_eq!(default.len(), 1, "one default of --scrape-interval");
    default[0].to_str().expect("a UTF-8 default").to_owned()
}

/// A relabelling rule in Prometheus's own keys, from the Prometheus Operator's camelCase ones.
fn snake_case_rule(rule: &Value) -> Value {
    let mut snake = serde_yaml::Mapping::new();
    for (key, value) in rule.as_mapping().expect("a relabelling rule") {
        let key = match key.as_str().expect("a rule's key") {
            "sourceLabels" => "source_labels",
            "targetLabel" => "target_label",
            other => other,
        };
        snake.insert(key.into(), value.clone());
    }
    Value::Mapping(snake)
}

#[test]
fn the_prometheus_examples_scrape_the_metrics_port_with_namespace_pool_and_pod() {
    let pool_label = lanepool::api::POOL_LABEL;
    let pool_meta = format!("__meta_kubernetes_pod_label_{}", discovered(pool_label));
    assert_eq!(pool_meta, "__meta_kubernetes_pod_label_lanepool_dev_pool");
    let monitor = example("examples/prometheus/podmonitor.yaml");
    let config = example("examples/prometheus/scrape-config.yaml");

    // The PodMonitor: every namespace's Pods with the pool label, at the port named `metrics`
    // (the one docs/worker-protocol.md names), the Pod's labels winning over a worker's own.
    assert_eq!(
        monitor["apiVersion"].as_str(),
        Some("monitoring.coreos.com/v1")
    );
    assert_eq!(monitor["kind"].as_str(), Some("PodMonitor"));
    let spec = &monitor["spec"];
    assert_eq!(spec["namespaceSelector"]["any"].as_bool(), Some(true));
    let selector: Value = serde_yaml::from_str(&format!(
        "matchExpressions: [{{key: {pool_label}, operator: Exists}}]"
    ))
    .unwrap();
    assert_eq!(spec["selector"], selector);
    let endpoints = spec["podMetricsEndpoints"]
        .as_sequence()
        .expect("endpoints");
    assert_eq!(endpoints.len(), 1, "one endpoint: {endpoints:?}");
    let endpoint = &endpoints[0];
    assert_eq!(endpoint["port"].as_str(), Some("metrics"));
    assert_ne!(endpoint["honorLabels"].as_bool(), Some(true));
    assert_ne!(endpoint["filterRunning"].as_bool(), Some(false));
    let labelled: Vec<(String, String)> = endpoint["relabelings"]
        .as_sequence()
        .expect("the PodMonitor's relabelings")
        .iter()
        .map(|rule| {
            let sources = rule["sourceLabels"]
                .as_sequence()
                .expect("one source label");
            assert_eq!(sources.len(), 1, "{rule:?}");
            let source = sources[0].as_str().unwrap().to_owned();
            (rule["targetLabel"].as_str().unwrap().to_owned(), source)
        })
        .collect();
    let wanted = [
        ("namespace", "__meta_kubernetes_namespace"),
        ("pool", pool_meta.as_str()),
        ("pod", "__meta_kubernetes_pod_name"),
    ]
    .map(|(target, source)| (target.to_owned(), source.to_owned()));
    assert_eq!(labelled, wanted);

    // The plain job: what the Prometheus Operator makes of that endpoint (v0.93.0's
    // pkg/prometheus/promcfg.go, generatePodMonitorConfig: the running filter, the selector, the
    // port), then the endpoint's relabelings.
    let jobs = config["scrape_configs"]
        .as_sequence()
        .expect("scrape_configs");
    assert_eq!(jobs.len(), 1, "one job: {jobs:?}");
    let job = &jobs[0];
    let sd: Value = serde_yaml::from_str("[{role: pod}]").unwrap();
    assert_eq!(job["kubernetes_sd_configs"], sd);
    assert_ne!(job["honor_labels"].as_bool(), Some(true));
    let present = format!(
        "__meta_kubernetes_pod_labelpresent_{}",
        discovered(pool_label)
    );
    let generated: Value = serde_yaml::from_str(&format!(
        "- {{source_labels: [__meta_kubernetes_pod_phase], regex: '(Failed|Succeeded)', \
             action: drop}}\n\
         - {{source_labels: [{present}], regex: 'true', action: keep}}\n\
         - {{source_labels: [__meta_kubernetes_pod_container_port_name], regex: metrics, \
             action: keep}}\n"
    ))
    .unwrap();
    let mut rules = generated.as_sequence().unwrap().clone();
    rules.extend(
        endpoint["relabelings"]
            .as_sequence()
            .unwrap()
            .iter()
            .map(snake_case_rule),
    );
    assert_eq!(job["relabel_configs"].as_sequence(), Some(&rules));

    // Both scrape as often as the operator assumes by default.
    let every = default_scrape_interval();
    assert_eq!(endpoint["interval"].as_str(), Some(every.as_str()));
    assert_eq!(job["scrape_interval"].as_str(), Some(every.as_str()));
}

// ---------------------------------------------------------------------------------------------
// The README's and the chart's NOTES.txt's commands and manifests, against the code.

/// A fenced code block: the fence's language, the lines inside.
type Block = (String, Vec<String>);

/// The fenced code blocks of `markdown`.
fn code_blocks(markdown: &str) -> Vec<Block> {
    let (mut blocks, mut open): (Vec<Block>, Option<Block>) = (Vec::new(), None);
    for line in markdown.lines() {
        let trimmed = line.trim_start();
        match (trimmed.strip_prefix("```"), open.take()) {
            (Some(language), None) => open = Some((language.trim().to_string(), Vec::new())),
            (Some(_), Some(block)) => blocks.push(block),
            (None, Some((language, mut lines))) => {
                lines.push(line.to_string());
                open = Some((language, lines));
            }
            (None, None) => {}
        }
    }
    blocks
}

/// The shell commands of `markdown` and `extra` lines: each line of a `sh` or `console` block
/// (a console line only after its `$ `), with `\` continuations joined and comments cut, and
/// each command in backticks in the text that starts with one of `programs`.
fn commands(markdown: &str, programs: &[&str]) -> Vec<String> {
    let mut commands = Vec::new();
    for (language, lines) in code_blocks(markdown) {
        if language != "sh" && language != "console" {
            continue;
        }
        let mut joined = String::new();
        for line in lines {
            let line = line.trim().to_string();
            let line = match language.as_str() {
                "console" if joined.is_empty() => match line.strip_prefix("$ ") {
                    Some(command) => command.to_string(),
                    None => continue,
                },
                _ => line,
            };
            let line = line.split(" # ").next().unwrap_or_default().trim_end();
            match line.strip_suffix('\\') {
                Some(more) => joined.push_str(more),
                None => {
                    joined.push_str(line);
                    commands.push(std::mem::take(&mut joined));
                }
            }
        }
    }
    for line in prose(markdown) {
        for (i, quoted) in line.split('`').enumerate() {
            if i % 2 == 1
                && programs
                    .iter()
                    .any(|p| quoted.starts_with(&format!("{p} ")))
            {
                commands.push(quoted.to_string());
            }
        }
    }
    commands
}

/// `command`'s words up to a redirection or a pipe, shell quotes taken off (no variables or
/// globs are expanded).
fn words(command: &str) -> Vec<String> {
    let (mut words, mut word, mut quote) = (Vec::new(), String::new(), None);
    for c in command.chars() {
        if quote.is_none() && (c == '>' || c == '|') {
            break;
        }
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => word.push(c),
            (None, '\'' | '"') => quote = Some(c),
            (None, c) if c.is_whitespace() => {
                if !word.is_empty() {
                    words.push(std::mem::take(&mut word));
                }
            }
            (None, c) => word.push(c),
        }
    }
    if !word.is_empty() {
        words.push(word);
    }
    words
}

#[test]
fn every_lanepool_command_in_the_readme_is_one_the_binary_takes() {
    let readme = read(&Path::new(ROOT).join("README.md"));
    let lanepool: Vec<Vec<String>> = commands(&readme, &["lanepool"])
        .iter()
        .map(|c| words(c))
        .filter(|w| w.first().is_some_and(|p| p == "lanepool"))
        .collect();
    assert!(lanepool.len() >= 3, "{lanepool:?}");
    for command in lanepool {
        // Each flag is parsed in turn before `--help` is reached: an unknown flag or a bad
        // value exits 2, naming it.
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_lanepool"))
            .args(&command[1..])
            .arg("--help")
            .output()
            .expect("running lanepool");
        assert!(
            output.status.success(),
            "README: `{}`: {}",
            command.join(" "),
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

/// The files a command names by a relative path, such as `kubectl apply -f examples/x.yaml`.
fn named_files(command: &[String]) -> Vec<String> {
    command
        .windows(2)
        .filter(|w| w[0] == "-f" || w[0] == "--filename")
        .map(|w| w[1].clone())
        .filter(|path| !path.starts_with('/') && !path.contains('$') && path != "-")
        .collect()
}

#[test]
fn every_file_and_chart_value_the_readme_and_notes_name_exists() {
    let root = Path::new(ROOT);
    let readme = read(&root.join("README.md"));
    let notes = read(&root.join("charts/lanepool/templates/NOTES.txt"));
    let values: Value =
        serde_yaml::from_str(&read(&root.join("charts/lanepool/values.yaml"))).unwrap();
    let mut checked = 0;
    for command in commands(&readme, &["kubectl", "helm", "lanepool"]) {
        let command = words(&command);
        for file in named_files(&command) {
            // A file the reader writes first (`> pool.yaml`) is theirs, not the repository's.
            if readme.contains(&format!("> {file}")) {
                continue;
            }
            assert!(
                root.join(&file).exists(),
                "README: {file} is not in the repository"
            );
            checked += 1;
        }
        if command.first().is_some_and(|p| p == "helm") {
            for set in command.windows(2).filter(|w| w[0] == "--set") {
                let key = set[1].split('=').next().unwrap_or_default();
                let mut at = &values;
                for part in key.split('.') {
                    at = at
                        .get(part)
                        .unwrap_or_else(|| panic!("README: helm --set {key}: no such value"));
                }
                checked += 1;
            }
        }
    }
    // NOTES.txt names files of the repository in prose, each ending in .yaml, .md or a `/`.
    for word in notes.split(|c: char| c.is_whitespace() || "(),:;".contains(c)) {
        let word = word.trim_end_matches('.');
        if (word.starts_with("examples/") || word.starts_with("docs/") || word.starts_with("crds/"))
            && !word.contains("{{")
        {
            assert!(
                root.join(word).exists(),
                "NOTES.txt: {word} is not in the repository"
            );
            checked += 1;
        }
    }
    assert!(checked >= 5, "{checked} names checked");
}

#[test]
fn the_readmes_first_pool_is_the_example_it_names() {
    let root = Path::new(ROOT);
    let readme = read(&root.join("README.md"));
    let shipped: Value =
        serde_yaml::from_str(&read(&root.join("examples/redis/lanepool-rq.yaml"))).unwrap();
    let pools: Vec<Value> = code_blocks(&readme)
        .into_iter()
        .filter(|(language, _)| language == "yaml")
        .filter_map(|(_, lines)| serde_yaml::from_str::<Value>(&lines.join("\n")).ok())
        .filter(|v| v.get("kind").and_then(Value::as_str) == Some("LanePool"))
        .collect();
    assert_eq!(
        pools,
        [shipped],
        "README's LanePool and examples/redis/lanepool-rq.yaml"
    );
    // And the binary's own reading of it: a LanePool the operator takes.
    let pool: lanepool::api::LanePool = serde_yaml::from_value(pools[0].clone()).unwrap();
    assert_eq!(pool.spec.total_workers, Some(10));
}
