//! The report: Markdown, JSON and one SVG chart per scenario, under target/bench/.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, Result};
use serde_json::{Value, json};

use crate::stats::Summary;

/// A Markdown table.
#[derive(Default)]
pub struct Table {
    pub header: Vec<String>,
    pub rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(header: &[&str]) -> Table {
        Table {
            header: header.iter().map(|h| h.to_string()).collect(),
            rows: vec![],
        }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    pub fn markdown(&self) -> String {
        let mut s = format!("| {} |\n", self.header.join(" | "));
        let _ = writeln!(s, "|{}", "---|".repeat(self.header.len()));
        for r in &self.rows {
            let _ = writeln!(s, "| {} |", r.join(" | "));
        }
        s
    }
}

/// One bar: a median with its spread.
pub struct Bar {
    pub label: String,
    pub value: Summary,
}

/// Ratios to a baseline, one bar each, with the target as a line.
pub struct Chart {
    pub title: String,
    pub axis: String,
    pub bars: Vec<Bar>,
    pub target: Option<(f64, String)>,
}

/// A headline row: what, measured, target, and whether the target is met.
pub struct Headline {
    pub what: String,
    pub measured: String,
    pub target: String,
    pub met: Option<bool>,
}

pub struct Section {
    pub name: String,
    pub title: String,
    pub intro: String,
    pub tables: Vec<Table>,
    pub notes: Vec<String>,
    pub chart: Option<Chart>,
    pub headlines: Vec<Headline>,
    pub json: Value,
}

impl Section {
    pub fn new(name: &str, title: &str, intro: &str) -> Section {
        Section {
            name: name.into(),
            title: title.into(),
            intro: intro.into(),
            tables: vec![],
            notes: vec![],
            chart: None,
            headlines: vec![],
            json: Value::Null,
        }
    }
}

/// What the run was: machine, date, commit, settings.
pub struct RunInfo {
    pub run_id: String,
    pub date: String,
    pub commit: String,
    pub machine: String,
    pub settings: Value,
}

fn verdict(met: Option<bool>) -> &'static str {
    match met {
        Some(true) => "met",
        Some(false) => "**not met**",
        None => "reported",
    }
}

pub fn write_all(dir: &Path, info: &RunInfo, sections: &[Section]) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    let mut md = format!(
        "# Benchmark report\n\nRun `{}` · {} · commit `{}` · {}\n\nEvery figure is measured in this run; ratios compare the operator with bare Jolokia on the same brokers and, in scenario 2, with the ideal-operator floor on the same bed (issue 45), each measured alongside it. Median (min–max, n = repeats).\n\n",
        info.run_id, info.date, info.commit, info.machine
    );
    let mut head = Table::new(&["scenario", "what", "measured", "target", "verdict"]);
    for s in sections {
        for h in &s.headlines {
            head.row(vec![
                s.title.clone(),
                h.what.clone(),
                h.measured.clone(),
                h.target.clone(),
                verdict(h.met).into(),
            ]);
        }
    }
    md.push_str("## Headline\n\n");
    md.push_str(&head.markdown());
    for s in sections {
        let _ = write!(md, "\n## {}\n\n{}\n\n", s.title, s.intro);
        for t in &s.tables {
            md.push_str(&t.markdown());
            md.push('\n');
        }
        if let Some(chart) = &s.chart {
            let file = format!("{}.svg", s.name);
            std::fs::write(dir.join(&file), svg(chart))?;
            let _ = writeln!(md, "![{}]({file})\n", chart.title);
        }
        for n in &s.notes {
            let _ = writeln!(md, "- {n}");
        }
    }
    let _ = writeln!(md, "\nSettings: `{}`", info.settings);
    std::fs::write(dir.join("report.md"), md)?;
    let json = json!({
        "run": info.run_id, "date": info.date, "commit": info.commit, "machine": info.machine,
        "settings": info.settings,
        "scenarios": sections.iter().map(|s| (s.name.clone(), s.json.clone())).collect::<serde_json::Map<_, _>>(),
    });
    std::fs::write(dir.join("report.json"), serde_json::to_string_pretty(&json)?)?;
    Ok(())
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// A horizontal bar chart: each bar its median, a whisker for min–max, a dashed target line.
pub fn svg(c: &Chart) -> String {
    let (left, width, row, top) = (300.0, 420.0, 30.0, 50.0);
    let max = c
        .bars
        .iter()
        .map(|b| b.value.max)
        .chain(c.target.as_ref().map(|t| t.0))
        .fold(0.0_f64, f64::max)
        .max(1e-9)
        * 1.1;
    let x = |v: f64| left + width * v / max;
    let height = top + row * c.bars.len() as f64 + 40.0;
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{height}\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"10\" y=\"22\" font-size=\"15\" font-weight=\"bold\">{}</text>\n",
        esc(&c.title),
        w = left + width + 80.0
    );
    for (i, b) in c.bars.iter().enumerate() {
        let y = top + row * i as f64;
        let _ = write!(
            s,
            "<text x=\"{tx}\" y=\"{ty}\" text-anchor=\"end\">{label}</text>\n<rect x=\"{left}\" y=\"{y}\" width=\"{bw:.1}\" height=\"18\" fill=\"#4a7fb5\"/>\n<line x1=\"{lo:.1}\" x2=\"{hi:.1}\" y1=\"{wy}\" y2=\"{wy}\" stroke=\"black\"/>\n<text x=\"{vx:.1}\" y=\"{ty}\">{v:.2}</text>\n",
            tx = left - 8.0,
            ty = y + 13.0,
            label = esc(&b.label),
            bw = x(b.value.median) - left,
            lo = x(b.value.min),
            hi = x(b.value.max),
            wy = y + 9.0,
            vx = x(b.value.max) + 6.0,
            v = b.value.median,
        );
    }
    let bottom = top + row * c.bars.len() as f64;
    if let Some((t, label)) = &c.target {
        let _ = write!(
            s,
            "<line x1=\"{tx:.1}\" x2=\"{tx:.1}\" y1=\"{y0}\" y2=\"{bottom}\" stroke=\"#c0392b\" stroke-dasharray=\"4,3\"/>\n<text x=\"{tx:.1}\" y=\"{y0t}\" fill=\"#c0392b\" text-anchor=\"middle\">{}</text>\n",
            esc(label),
            tx = x(*t),
            y0 = top - 8.0,
            y0t = top - 12.0,
        );
    }
    let _ = write!(
        s,
        "<line x1=\"{left}\" x2=\"{right}\" y1=\"{bottom}\" y2=\"{bottom}\" stroke=\"#888\"/>\n<text x=\"{left}\" y=\"{ly}\" fill=\"#555\">0</text>\n<text x=\"{right}\" y=\"{ly}\" fill=\"#555\" text-anchor=\"end\">{max:.2} — {axis}</text>\n</svg>\n",
        right = left + width,
        ly = bottom + 18.0,
        axis = esc(&c.axis),
    );
    s
}
