//! `--annotation-prefix` (flannel's `--kube-annotation-prefix` rules): a prefix accepted gives keys
//! the API server accepts, checked here by an independent reading of its `IsQualifiedName` rule; the
//! normalised prefix is accepted again as itself; every key is the prefix and a lease name.

use netcm_node::{Keys, PrefixError};

const F: &str = "--annotation-prefix";

/// Kubernetes' `IsQualifiedName`, read from apimachinery's validation: `[prefix/]name`, the prefix a
/// DNS-1123 subdomain (at most 253 characters), the name 1–63 characters of
/// `([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]`.
fn qualified_name(key: &str) -> bool {
    let parts: Vec<&str> = key.split('/').collect();
    let (prefix, name) = match parts[..] {
        [name] => (None, name),
        [prefix, name] => (Some(prefix), name),
        _ => return false,
    };
    let dns_label = |l: &str| {
        let b = l.as_bytes();
        !b.is_empty()
            && b.len() <= 63
            && b.iter()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
            && b[0] != b'-'
            && b[b.len() - 1] != b'-'
    };
    if let Some(p) = prefix {
        if p.is_empty() || p.len() > 253 || !p.split('.').all(dns_label) {
            return false;
        }
    }
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// The checks, on one input as libFuzzer hands it over.
pub fn check(data: &[u8]) {
    let Ok(value) = std::str::from_utf8(data) else {
        return;
    };
    match Keys::new(F, value) {
        Ok(keys) => {
            let p = keys.prefix.as_str();
            assert!(p.ends_with('/') || p.ends_with('-'), "{p:?}");
            assert_eq!(p.matches('/').count(), 1, "{p:?}");
            assert!(p.starts_with(value), "{value:?} became {p:?}");
            assert!(p.len() <= value.len() + 1);
            for (k, name) in keys.all().zip([
                "kube-subnet-manager",
                "backend-type",
                "backend-data",
                "backend-v6-data",
                "public-ip",
                "public-ipv6",
                "public-ip-overwrite",
                "public-ipv6-overwrite",
            ]) {
                assert_eq!(k, format!("{p}{name}"));
                assert!(
                    qualified_name(k),
                    "{value:?} gives {k:?}, which the API server refuses"
                );
            }
            assert_eq!(
                Keys::new(F, p),
                Ok(keys.clone()),
                "the normalised prefix reads as itself"
            );
        }
        Err(PrefixError::Slashes { .. }) => assert!(value.matches('/').count() > 1),
        Err(PrefixError::Key { key, .. }) => {
            assert!(
                !qualified_name(&key),
                "{key:?} refused, yet the API server takes it"
            )
        }
        Err(PrefixError::Format { .. }) => {}
    }
}
