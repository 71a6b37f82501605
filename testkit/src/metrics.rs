//! Reading Prometheus text in tests: one parser for every harness.

/// Sum of the samples of every series line starting with `prefix` (a name,
/// or a name and the start of its labels).
pub fn prefix_sum(text: &str, prefix: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(prefix) && !l.starts_with('#'))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Sum of the samples of metric `name` (exactly) whose labels contain every
/// `labels` pair.
pub fn metric_sum(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.split(['{', ' ']).next() == Some(name))
        .filter(|l| {
            labels
                .iter()
                .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_by_prefix_and_by_exact_name_and_labels() {
        let text = "# TYPE a counter\na_total{x=\"1\"} 2\na_total{x=\"2\"} 3\nab 7\n";
        assert_eq!(prefix_sum(text, "a_total"), 5.0);
        assert_eq!(prefix_sum(text, "a"), 12.0);
        assert_eq!(metric_sum(text, "a_total", &[("x", "2")]), 3.0);
        assert_eq!(metric_sum(text, "a", &[]), 0.0);
    }
}
