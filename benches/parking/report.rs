//! What a bench run found: the Markdown table a person reads, and
//! `bench-results.json`, which `make bench-compare A B` reads: every target
//! with its measured value and whether it is met, and the raw figures of
//! every scenario.

use std::fmt::Write;

use atenet_router::telemetry::logging::json_string;

/// How a target bounds its value.
#[derive(Clone, Copy, Debug)]
pub enum Bound {
    AtMost(f64),
    AtLeast(f64),
    Equal(f64),
}

impl Bound {
    fn holds(self, value: f64) -> bool {
        match self {
            Bound::AtMost(b) => value <= b,
            Bound::AtLeast(b) => value >= b,
            Bound::Equal(b) => value == b,
        }
    }

    fn text(self) -> String {
        match self {
            Bound::AtMost(b) => format!("<= {b}"),
            Bound::AtLeast(b) => format!(">= {b}"),
            Bound::Equal(b) => format!("= {b}"),
        }
    }
}

struct Target {
    name: String,
    value: f64,
    bound: Bound,
}

#[derive(Default)]
pub struct Report {
    text: String,
    targets: Vec<Target>,
    /// (scenario, figure, value), in the order measured.
    figures: Vec<(String, String, f64)>,
}

impl Report {
    /// Prints a line of the Markdown report and keeps it.
    pub fn line(&mut self, line: &str) {
        println!("{line}");
        self.text.push_str(line);
        self.text.push('\n');
    }

    /// Judges a target (on a median the scenario computed) and returns a
    /// cell for its table: the value in bold, and a mark when it is missed.
    pub fn target(&mut self, name: &str, value: f64, bound: Bound) -> String {
        let met = bound.holds(value);
        self.targets.push(Target { name: name.to_string(), value, bound });
        if met {
            String::from("met")
        } else {
            String::from("**MISSED**")
        }
    }

    /// Keeps a raw figure of a scenario for the JSON file.
    pub fn figure(&mut self, scenario: &str, name: &str, value: f64) {
        self.figures.push((scenario.to_string(), name.to_string(), value));
    }

    /// The targets as a Markdown table, for the end of the report.
    pub fn summary(&mut self) {
        self.line("\n## Targets (each on the median of its runs)\n");
        self.line("| target | value | bound | status |");
        self.line("|---|---|---|---|");
        let rows: Vec<String> = self
            .targets
            .iter()
            .map(|t| {
                let status = if t.bound.holds(t.value) { "met" } else { "**MISSED**" };
                format!("| {} | {} | {} | {status} |", t.name, round(t.value), t.bound.text())
            })
            .collect();
        for row in rows {
            self.line(&row);
        }
    }

    pub fn markdown(&self) -> &str {
        &self.text
    }

    pub fn json(&self, machine: &str, date: &str) -> String {
        let mut out =
            format!("{{\"machine\":{},\"date\":{},\"targets\":[", json_string(machine), json_string(date));
        for (i, t) in self.targets.iter().enumerate() {
            let _ = write!(
                out,
                "{}{{\"name\":{},\"value\":{},\"target\":{},\"met\":{}}}",
                if i > 0 { "," } else { "" },
                json_string(&t.name),
                number(t.value),
                json_string(&t.bound.text()),
                t.bound.holds(t.value)
            );
        }
        out.push_str("],\"figures\":{");
        let mut scenarios: Vec<&str> = Vec::new();
        for (scenario, _, _) in &self.figures {
            if !scenarios.contains(&scenario.as_str()) {
                scenarios.push(scenario);
            }
        }
        for (i, scenario) in scenarios.iter().enumerate() {
            let _ = write!(out, "{}{}:{{", if i > 0 { "," } else { "" }, json_string(scenario));
            let figures = self.figures.iter().filter(|(s, _, _)| s == scenario);
            for (j, (_, name, value)) in figures.enumerate() {
                let _ =
                    write!(out, "{}{}:{}", if j > 0 { "," } else { "" }, json_string(name), number(*value));
            }
            out.push('}');
        }
        out.push_str("}}\n");
        out
    }
}

/// JSON has no NaN or infinity: an unmeasurable figure is null.
fn number(value: f64) -> String {
    if value.is_finite() {
        format!("{value}")
    } else {
        String::from("null")
    }
}

fn round(value: f64) -> String {
    if value.abs() >= 100.0 || value.fract() == 0.0 {
        format!("{value:.0}")
    } else {
        format!("{value:.3}")
    }
}

/// The median (the upper one of an even count).
pub fn median(mut values: Vec<f64>) -> f64 {
    assert!(!values.is_empty(), "a median of no runs");
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}
