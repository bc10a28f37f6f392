//! The `hitcost.svg` bar chart: ns per hit on a log axis, a bar a row, grouped as the table
//! groups them.

use crate::engines::{Engine, Failure, Kind};
use crate::report::{fmt_ns, group_of, group_thousands, HitRow, Report};
use std::fmt::Write as _;

impl Report {
    /// Horizontal bars of ns per hit on a log axis; rows without a number are written out.
    pub fn svg(&self) -> String {
        const LABEL_W: f64 = 300.0;
        const BAR_W: f64 = 560.0;
        const ROW_H: f64 = 18.0;
        const TOP: f64 = 64.0;
        const WIDTH: f64 = 1080.0;
        let x0 = LABEL_W + 10.0;
        let values: Vec<f64> =
            self.rows.iter().filter_map(|r| self.derived(r)).map(|d| d.per_hit.median).filter(|v| *v > 0.0).collect();
        let lo = values.iter().copied().fold(f64::INFINITY, f64::min).max(0.1);
        let hi = values.iter().copied().fold(0.0, f64::max).max(lo * 10.0);
        let (lo_exp, hi_exp) =
            if values.is_empty() { (0, 6) } else { (lo.log10().floor() as i32, hi.log10().ceil() as i32) };
        let span = f64::from((hi_exp - lo_exp).max(1));
        let x_of = |v: f64| x0 + BAR_W * ((v.max(10f64.powi(lo_exp)).log10() - f64::from(lo_exp)) / span);
        let (offsets, rows_h) = row_offsets(&self.rows, ROW_H, 8.0);
        let height = TOP + rows_h + 50.0;

        let mut s = String::new();
        let _ = writeln!(
            s,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="DejaVu Sans, Helvetica, Arial, sans-serif" font-size="12">"#
        );
        let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
        let _ = writeln!(
            s,
            r#"<text x="{x0}" y="20" font-size="15" font-weight="bold">ns per probe hit over an unprobed call (log scale)</text>"#
        );
        let _ = writeln!(s, r##"<text x="{x0}" y="38" fill="#555">{}</text>"##, xml_escape(&self.machine.summary()));
        let axis_bottom = TOP + rows_h;
        for e in lo_exp..=hi_exp {
            let x = x_of(10f64.powi(e));
            let _ = writeln!(
                s,
                r##"<line x1="{x:.1}" y1="{:.1}" x2="{x:.1}" y2="{axis_bottom:.1}" stroke="#ddd"/>"##,
                TOP - 6.0
            );
            let _ = writeln!(
                s,
                r##"<text x="{x:.1}" y="{:.1}" text-anchor="middle" fill="#333">{}</text>"##,
                axis_bottom + 16.0,
                fmt_decade(e)
            );
        }
        let _ = writeln!(
            s,
            r##"<text x="{:.1}" y="{:.1}" text-anchor="middle" fill="#333">ns per hit</text>"##,
            x0 + BAR_W / 2.0,
            axis_bottom + 34.0
        );
        for (i, row) in self.rows.iter().enumerate() {
            let y = TOP + offsets[i];
            let label = format!(
                "{} {} {}{}",
                row.engine.name(),
                if row.kind == Kind::Trap { "(bare int3 round trip)" } else { row.kind.name() },
                if row.kind == Kind::Trap { "" } else { row.function },
                if row.threads > 1 { format!(" ×{}", row.threads) } else { String::new() }
            );
            let _ = writeln!(
                s,
                r#"<text x="{LABEL_W}" y="{:.1}" text-anchor="end">{}</text>"#,
                y + 13.0,
                xml_escape(&label)
            );
            match (&row.failure, self.derived(row)) {
                (None, Some(d)) => {
                    let v = d.per_hit.median;
                    let x1 = x_of(v);
                    let _ = writeln!(
                        s,
                        r#"<rect x="{x0}" y="{:.1}" width="{:.1}" height="{:.1}" fill="{}"/>"#,
                        y + 2.0,
                        (x1 - x0).max(1.0),
                        ROW_H - 4.0,
                        engine_color(row.engine)
                    );
                    let note = if d.baseline.is_none() { " (plain call)" } else { "" };
                    let _ = writeln!(
                        s,
                        r#"<text x="{:.1}" y="{:.1}">{} ns{note}</text>"#,
                        x1.max(x0) + 4.0,
                        y + 13.0,
                        fmt_ns(v)
                    );
                }
                (failure, _) => {
                    let text = match failure {
                        Some(Failure::Unavailable(r)) => format!("unavailable: {r}"),
                        Some(Failure::Invalid(r)) => format!("invalid: {r}"),
                        None => "no result".into(),
                    };
                    let text: String = text.chars().take(110).collect();
                    let _ = writeln!(
                        s,
                        r##"<text x="{:.1}" y="{:.1}" fill="#888" font-style="italic">{}</text>"##,
                        x0 + 4.0,
                        y + 13.0,
                        xml_escape(&text)
                    );
                }
            }
        }
        s.push_str("</svg>\n");
        s
    }
}

/// Top of each row in the chart, with a gap between groups; and the total height used.
fn row_offsets(rows: &[HitRow], row_h: f64, gap: f64) -> (Vec<f64>, f64) {
    let mut y = 0.0;
    let mut out = Vec::with_capacity(rows.len());
    for (i, row) in rows.iter().enumerate() {
        if i > 0 && group_of(&rows[i - 1]) != group_of(row) {
            y += gap;
        }
        out.push(y);
        y += row_h;
    }
    (out, y)
}

fn engine_color(e: Engine) -> &'static str {
    match e {
        Engine::None => "#9e9e9e",
        Engine::Sigtrap => "#8c564b",
        Engine::Int3 => "#1f77b4",
        Engine::Jump => "#17becf",
        Engine::Kernel => "#2ca02c",
        Engine::PtraceOol => "#ff7f0e",
        Engine::Ptrace => "#d62728",
        Engine::PtraceXcpu => "#7f1d1d",
    }
}

pub(crate) fn fmt_decade(e: i32) -> String {
    match e {
        i32::MIN..=-1 => format!("{}", 10f64.powi(e)),
        0..=6 => group_thousands(10u64.pow(e as u32)),
        _ => format!("1e{e}"),
    }
}

fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}
