//! [`NodeSelector`]: which Nodes a pool serves, as a core `NodeSelector` says it, without Kubernetes
//! types (the allocator converts them).
//!
//! Kubernetes semantics: terms are ORed, the requirements of one term ANDed, and an empty term matches
//! nothing. Two rules follow node-ipam-controller for ClusterCIDRs: a nil selector is the fallback that
//! serves every Node after all pools with a selector, and a selector with no terms selects every Node.

use std::collections::BTreeMap;

/// A requirement's operator, as in `NodeSelectorRequirement.operator`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operator {
    /// The value is one of `values`.
    In,
    /// The key is absent or its value is none of `values`.
    NotIn,
    /// The key is present.
    Exists,
    /// The key is absent.
    DoesNotExist,
    /// The value, as an integer, is greater than the single value.
    Gt,
    /// The value, as an integer, is less than the single value.
    Lt,
}

impl std::str::FromStr for Operator {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "In" => Operator::In,
            "NotIn" => Operator::NotIn,
            "Exists" => Operator::Exists,
            "DoesNotExist" => Operator::DoesNotExist,
            "Gt" => Operator::Gt,
            "Lt" => Operator::Lt,
            other => return Err(format!("{other:?} is not a valid node selector operator")),
        })
    }
}

/// One `key operator values` requirement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requirement {
    /// The label key (or, for a field requirement, the field path).
    pub key: String,
    /// How the value is compared.
    pub operator: Operator,
    /// The values compared against.
    pub values: Vec<String>,
}

impl Requirement {
    /// Whether `value` (None: the key is absent) satisfies the requirement.
    fn matches(&self, value: Option<&str>) -> bool {
        let int = |s: &str| s.trim().parse::<i64>().ok();
        match self.operator {
            Operator::In => value.is_some_and(|v| self.values.iter().any(|x| x == v)),
            Operator::NotIn => value.is_none_or(|v| !self.values.iter().any(|x| x == v)),
            Operator::Exists => value.is_some(),
            Operator::DoesNotExist => value.is_none(),
            Operator::Gt | Operator::Lt => {
                let (Some(have), [want]) = (value.and_then(int), self.values.as_slice()) else {
                    return false;
                };
                let Some(want) = int(want) else {
                    return false;
                };
                if self.operator == Operator::Gt {
                    have > want
                } else {
                    have < want
                }
            }
        }
    }
}

/// One `NodeSelectorTerm`: label and field requirements, all of which must hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SelectorTerm {
    /// `matchExpressions`, on labels.
    pub match_expressions: Vec<Requirement>,
    /// `matchFields`; Kubernetes supports only `metadata.name` for Nodes.
    pub match_fields: Vec<Requirement>,
}

impl SelectorTerm {
    /// The number of requirements if all hold, else None; an empty term matches nothing.
    fn score(&self, node: &NodeView<'_>) -> Option<usize> {
        let n = self.match_expressions.len() + self.match_fields.len();
        if n == 0 {
            return None;
        }
        let labels_ok = self
            .match_expressions
            .iter()
            .all(|r| r.matches(node.labels.label(&r.key)));
        let fields_ok = self.match_fields.iter().all(|r| {
            let value = (r.key == "metadata.name").then_some(node.name);
            r.key == "metadata.name" && r.matches(value)
        });
        (labels_ok && fields_ok).then_some(n)
    }
}

/// A pool's node selector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeSelector {
    /// No selector (`nodeSelector` unset, and the flag pool): serves every Node, after all others.
    Fallback,
    /// A selector with these terms (none: every Node).
    Terms(Vec<SelectorTerm>),
}

/// What the pools look at of a Node: its name and labels (selectors), and its `spec.providerID` (a Node
/// re-created under another name but on the same machine gets back what it released).
#[derive(Clone, Copy)]
pub struct NodeView<'a> {
    /// `metadata.name`.
    pub name: &'a str,
    /// `metadata.labels`.
    pub labels: &'a dyn Labels,
    /// `spec.providerID`, when the caller keeps it.
    pub provider_id: Option<&'a str>,
}

/// A Node's labels, however they are held (a map, or the informer's cached Node).
pub trait Labels {
    /// The value of the label `key`, if the Node has it.
    fn label(&self, key: &str) -> Option<&str>;
}

impl Labels for BTreeMap<String, String> {
    fn label(&self, key: &str) -> Option<&str> {
        self.get(key).map(String::as_str)
    }
}

impl NodeSelector {
    /// None if the selector does not select the Node; else how many requirements matched (the best
    /// matching term's), which ranks more specific pools first.
    pub fn score(&self, node: &NodeView<'_>) -> Option<usize> {
        match self {
            NodeSelector::Fallback => Some(0),
            NodeSelector::Terms(terms) if terms.is_empty() => Some(0),
            NodeSelector::Terms(terms) => terms.iter().filter_map(|t| t.score(node)).max(),
        }
    }

    /// Whether this is the fallback (no selector).
    pub fn is_fallback(&self) -> bool {
        matches!(self, NodeSelector::Fallback)
    }

    /// Whether the selector reads any label (a `matchExpressions` requirement); `metadata.name` fields
    /// and the fallback need only the Node's name.
    pub fn reads_labels(&self) -> bool {
        match self {
            NodeSelector::Fallback => false,
            NodeSelector::Terms(terms) => terms.iter().any(|t| !t.match_expressions.is_empty()),
        }
    }

    /// The selector as node-ipam-controller keys and ranks it (`labels.Selector.String()` of every
    /// term's requirements, fields included, ANDed): requirements ordered by key (stably), each as
    /// `key`, `!key`, `key in (a,b)`, `key notin (a,b)`, `key>n` or `key<n` with its values sorted,
    /// joined by `,`; no terms is `""`. The fallback is upstream's internal catch-all selector. Two pools
    /// that tie on everything before it are ranked by this text, lower first.
    pub fn upstream_string(&self) -> String {
        let terms = match self {
            NodeSelector::Fallback => return "kubernetes.io/clusterCIDR in (default)".into(),
            NodeSelector::Terms(terms) => terms,
        };
        let mut reqs: Vec<&Requirement> = terms
            .iter()
            .flat_map(|t| t.match_expressions.iter().chain(&t.match_fields))
            .collect();
        reqs.sort_by(|a, b| a.key.cmp(&b.key));
        reqs.iter()
            .map(|r| {
                let mut values: Vec<&str> = r.values.iter().map(String::as_str).collect();
                values.sort_unstable();
                let values = values.join(",");
                match r.operator {
                    Operator::Exists => r.key.clone(),
                    Operator::DoesNotExist => format!("!{}", r.key),
                    Operator::In => format!("{} in ({values})", r.key),
                    Operator::NotIn => format!("{} notin ({values})", r.key),
                    Operator::Gt => format!("{}>{values}", r.key),
                    Operator::Lt => format!("{}<{values}", r.key),
                }
            })
            .collect::<Vec<_>>()
            .join(",")
    }

    /// A short text for people (`kubectl get` columns, logs): `<all>` or `key op values` per term.
    pub fn summary(&self) -> String {
        match self {
            NodeSelector::Fallback => "<all>".into(),
            NodeSelector::Terms(terms) if terms.is_empty() => "<all>".into(),
            NodeSelector::Terms(terms) => terms
                .iter()
                .map(|t| {
                    t.match_expressions
                        .iter()
                        .chain(&t.match_fields)
                        .map(|r| match r.operator {
                            Operator::Exists => r.key.clone(),
                            Operator::DoesNotExist => format!("!{}", r.key),
                            Operator::In if r.values.len() == 1 => {
                                format!("{}={}", r.key, r.values[0])
                            }
                            op => format!("{} {op:?} ({})", r.key, r.values.join(",")),
                        })
                        .collect::<Vec<_>>()
                        .join(",")
                })
                .collect::<Vec<_>>()
                .join(" || "),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn req(key: &str, op: &str, values: &[&str]) -> Requirement {
        Requirement {
            key: key.into(),
            operator: op.parse().unwrap(),
            values: values.iter().map(|v| v.to_string()).collect(),
        }
    }

    fn term(reqs: Vec<Requirement>) -> SelectorTerm {
        SelectorTerm {
            match_expressions: reqs,
            match_fields: vec![],
        }
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn every_operator_compares_as_kubernetes_does() {
        let l = labels(&[("role", "gpu"), ("cores", "64")]);
        let n = NodeView {
            name: "a",
            labels: &l,
            provider_id: None,
        };
        let yes = |r: Requirement| NodeSelector::Terms(vec![term(vec![r])]).score(&n) == Some(1);
        assert!(yes(req("role", "In", &["gpu", "cpu"])));
        assert!(!yes(req("role", "NotIn", &["gpu"])));
        assert!(yes(req("zone", "NotIn", &["a"])));
        assert!(yes(req("role", "Exists", &[])));
        assert!(yes(req("zone", "DoesNotExist", &[])));
        assert!(yes(req("cores", "Gt", &["32"])));
        assert!(!yes(req("cores", "Lt", &["32"])));
        assert!(!yes(req("role", "Gt", &["1"])));
    }

    #[test]
    fn terms_are_ored_and_score_the_best_matching_term() {
        let l = labels(&[("a", "1"), ("b", "2")]);
        let n = NodeView {
            name: "n",
            labels: &l,
            provider_id: None,
        };
        let s = NodeSelector::Terms(vec![
            term(vec![req("a", "Exists", &[])]),
            term(vec![req("a", "Exists", &[]), req("b", "In", &["2"])]),
            term(vec![req("c", "Exists", &[])]),
        ]);
        assert_eq!(s.score(&n), Some(2));
        let none = NodeSelector::Terms(vec![term(vec![req("c", "Exists", &[])])]);
        assert_eq!(none.score(&n), None);
    }

    #[test]
    fn an_empty_term_matches_nothing_but_no_terms_and_no_selector_match_everything() {
        let l = labels(&[]);
        let n = NodeView {
            name: "n",
            labels: &l,
            provider_id: None,
        };
        assert_eq!(
            NodeSelector::Terms(vec![SelectorTerm::default()]).score(&n),
            None
        );
        assert_eq!(NodeSelector::Terms(vec![]).score(&n), Some(0));
        assert_eq!(NodeSelector::Fallback.score(&n), Some(0));
    }

    #[test]
    fn field_requirements_match_the_node_name_only() {
        let l = labels(&[]);
        let n = NodeView {
            name: "n1",
            labels: &l,
            provider_id: None,
        };
        let by = |key: &str| {
            NodeSelector::Terms(vec![SelectorTerm {
                match_expressions: vec![],
                match_fields: vec![req(key, "In", &["n1"])],
            }])
            .score(&n)
        };
        assert_eq!(by("metadata.name"), Some(1));
        assert_eq!(by("spec.unschedulable"), None);
    }

    #[test]
    fn the_summary_is_short_for_people() {
        let s = NodeSelector::Terms(vec![term(vec![
            req("node-role", "In", &["gpu"]),
            req("big", "Exists", &[]),
        ])]);
        assert_eq!(s.summary(), "node-role=gpu,big");
        assert_eq!(NodeSelector::Fallback.summary(), "<all>");
    }

    #[test]
    fn the_upstream_string_orders_requirements_by_key_and_values_as_text() {
        let s = NodeSelector::Terms(vec![
            term(vec![
                req("zone", "NotIn", &["b", "a"]),
                req("role", "In", &["gpu"]),
            ]),
            SelectorTerm {
                match_expressions: vec![
                    req("cores", "Gt", &["32"]),
                    req("arm", "DoesNotExist", &[]),
                ],
                match_fields: vec![req("metadata.name", "In", &["n2", "n10"])],
            },
            term(vec![req("big", "Exists", &[]), req("mem", "Lt", &["8"])]),
        ]);
        assert_eq!(
            s.upstream_string(),
            "!arm,big,cores>32,mem<8,metadata.name in (n10,n2),role in (gpu),zone notin (a,b)"
        );
        assert_eq!(NodeSelector::Terms(vec![]).upstream_string(), "");
        assert_eq!(
            NodeSelector::Fallback.upstream_string(),
            "kubernetes.io/clusterCIDR in (default)"
        );
    }
}
