//! The annotation keys of a flannel subnet lease, derived from `--annotation-prefix` with flannel's
//! `--kube-annotation-prefix` rules, and checked to be keys the API server accepts.

use crate::Family;

/// The prefix is not one flannel (or the API server) accepts.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PrefixError {
    /// More than one "/".
    #[error("{flag} {value:?}: the prefix can contain at most one \"/\"")]
    Slashes {
        /// The flag.
        flag: &'static str,
        /// Its value.
        value: String,
    },
    /// Not `fqdn/[0-9a-z-_]*`.
    #[error("{flag} {value:?}: the prefix must be in the format fqdn/[0-9a-z-_]* (lowercase letters, digits, '-', '_'; at least one '.' before the '/')")]
    Format {
        /// The flag.
        flag: &'static str,
        /// Its value.
        value: String,
    },
    /// flannel's pattern matches, but a resulting key breaks the API server's annotation key rules.
    #[error("{flag} {prefix:?}: {key:?} would not be a valid annotation key: {why}")]
    Key {
        /// The flag.
        flag: &'static str,
        /// The flag value.
        prefix: String,
        /// The offending key.
        key: String,
        /// The rule it breaks.
        why: String,
    },
}

/// Every key of the lease under one prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keys {
    /// The normalised prefix, ending in "/" or "-" (`flannel.alpha.coreos.com/`).
    pub prefix: String,
    /// `<p>kube-subnet-manager`.
    pub kube_subnet_manager: String,
    /// `<p>backend-type`.
    pub backend_type: String,
    /// `<p>backend-data`.
    pub backend_data: String,
    /// `<p>backend-v6-data`.
    pub backend_v6_data: String,
    /// `<p>public-ip`.
    pub public_ip: String,
    /// `<p>public-ipv6`.
    pub public_ipv6: String,
    /// `<p>public-ip-overwrite` (set by users; read only).
    pub public_ip_overwrite: String,
    /// `<p>public-ipv6-overwrite` (set by users; read only).
    pub public_ipv6_overwrite: String,
}

impl Keys {
    /// Normalises and checks a prefix as flannel's `newAnnotations` does: no "/" → one is appended; at
    /// most one "/"; a name part that does not end in "/" or "-" gets a "-". Unlike flannel's regexp the
    /// whole string must match (flannel's is anchored only at the end, so it accepts e.g. upper case
    /// before the last label, which the API server then refuses), and every key must be a valid
    /// annotation key.
    pub fn new(flag: &'static str, value: &str) -> Result<Self, PrefixError> {
        let mut prefix = value.to_string();
        match prefix.matches('/').count() {
            0 => prefix.push('/'),
            1 => {}
            _ => {
                return Err(PrefixError::Slashes {
                    flag,
                    value: value.to_string(),
                })
            }
        }
        if !prefix.ends_with('/') && !prefix.ends_with('-') {
            prefix.push('-');
        }
        if !matches_flannel_pattern(&prefix) {
            return Err(PrefixError::Format {
                flag,
                value: value.to_string(),
            });
        }
        let key = |name: &str| format!("{prefix}{name}");
        let keys = Keys {
            kube_subnet_manager: key("kube-subnet-manager"),
            backend_type: key("backend-type"),
            backend_data: key("backend-data"),
            backend_v6_data: key("backend-v6-data"),
            public_ip: key("public-ip"),
            public_ipv6: key("public-ipv6"),
            public_ip_overwrite: key("public-ip-overwrite"),
            public_ipv6_overwrite: key("public-ipv6-overwrite"),
            prefix,
        };
        for k in keys.all() {
            if let Err(why) = check_annotation_key(k) {
                return Err(PrefixError::Key {
                    flag,
                    prefix: value.to_string(),
                    key: k.to_string(),
                    why,
                });
            }
        }
        Ok(keys)
    }

    /// `<p>public-ip` or `<p>public-ipv6`: the lease's public IP of `family`.
    pub fn public_ip_of(&self, family: Family) -> &str {
        match family {
            Family::V4 => &self.public_ip,
            Family::V6 => &self.public_ipv6,
        }
    }

    /// `<p>public-ip-overwrite` or `<p>public-ipv6-overwrite`: the users' overwrite of `family`.
    pub fn public_ip_overwrite_of(&self, family: Family) -> &str {
        match family {
            Family::V4 => &self.public_ip_overwrite,
            Family::V6 => &self.public_ipv6_overwrite,
        }
    }

    /// The keys of the lease itself, which a publisher writes (everything but the users' overwrites).
    pub fn lease(&self) -> [&str; 6] {
        [
            &self.kube_subnet_manager,
            &self.backend_type,
            &self.backend_data,
            &self.backend_v6_data,
            &self.public_ip,
            &self.public_ipv6,
        ]
    }

    /// Every key netcm reads or writes.
    pub fn all(&self) -> [&str; 8] {
        [
            &self.kube_subnet_manager,
            &self.backend_type,
            &self.backend_data,
            &self.backend_v6_data,
            &self.public_ip,
            &self.public_ipv6,
            &self.public_ip_overwrite,
            &self.public_ipv6_overwrite,
        ]
    }
}

fn is_flannel_char(c: char) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_'
}

/// `(?:[a-z0-9_-]+\.)+[a-z0-9_-]+/(?:[a-z0-9_-]+-)?`, matched against the whole string.
fn matches_flannel_pattern(prefix: &str) -> bool {
    let Some((fqdn, name)) = prefix.split_once('/') else {
        return false;
    };
    let labels: Vec<&str> = fqdn.split('.').collect();
    let fqdn_ok = labels.len() >= 2
        && labels
            .iter()
            .all(|l| !l.is_empty() && l.chars().all(is_flannel_char));
    let name_ok = name.is_empty()
        || (name.len() >= 2 && name.ends_with('-') && name.chars().all(is_flannel_char));
    fqdn_ok && name_ok
}

/// The API server's rule for annotation keys (`IsQualifiedName`): an optional DNS-1123 subdomain prefix
/// of at most 253 characters, "/", and a name of 1–63 characters `([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]`.
fn check_annotation_key(key: &str) -> Result<(), String> {
    let (domain, name) = key.split_once('/').unwrap_or(("", key));
    if !domain.is_empty() {
        if domain.len() > 253 {
            return Err("the part before \"/\" must be at most 253 characters".into());
        }
        let label_ok = |l: &str| {
            !l.is_empty()
                && l.len() <= 63
                && l.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        };
        if !domain.split('.').all(label_ok) {
            return Err("the part before \"/\" must be a DNS subdomain: lowercase letters, digits, '-' and '.', each label starting and ending with a letter or digit".into());
        }
    }
    if name.is_empty() || name.len() > 63 {
        return Err("the part after \"/\" must be 1 to 63 characters".into());
    }
    let alnum = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    if !alnum(name.chars().next())
        || !alnum(name.chars().last())
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    {
        return Err("the part after \"/\" must start and end with a letter or digit and contain only letters, digits, '-', '_' and '.'".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    /// The flag named in errors.
    const F: &str = "--annotation-prefix";
    use super::*;

    #[test]
    fn the_default_prefix_gives_flannels_keys() {
        let k = Keys::new(F, "flannel.alpha.coreos.com").expect("valid");
        assert_eq!(k.prefix, "flannel.alpha.coreos.com/");
        assert_eq!(k.public_ip, "flannel.alpha.coreos.com/public-ip");
        assert_eq!(
            k.backend_v6_data,
            "flannel.alpha.coreos.com/backend-v6-data"
        );
        assert_eq!(
            k.public_ipv6_overwrite,
            "flannel.alpha.coreos.com/public-ipv6-overwrite"
        );
    }

    #[test]
    fn the_public_ip_keys_of_a_family_are_the_leases_and_the_overwrites() {
        let k = Keys::new(F, "example.com/net").expect("valid");
        assert_eq!(k.public_ip_of(Family::V4), "example.com/net-public-ip");
        assert_eq!(k.public_ip_of(Family::V6), "example.com/net-public-ipv6");
        assert_eq!(
            k.public_ip_overwrite_of(Family::V4),
            "example.com/net-public-ip-overwrite"
        );
        assert_eq!(
            k.public_ip_overwrite_of(Family::V6),
            "example.com/net-public-ipv6-overwrite"
        );
    }

    #[test]
    fn a_trailing_slash_is_kept_and_a_name_part_gets_a_dash() {
        assert_eq!(
            Keys::new(F, "example.com/").expect("valid").public_ip,
            "example.com/public-ip"
        );
        assert_eq!(
            Keys::new(F, "example.com/lease").expect("valid").public_ip,
            "example.com/lease-public-ip"
        );
        assert_eq!(
            Keys::new(F, "example.com/lease-")
                .expect("valid")
                .backend_type,
            "example.com/lease-backend-type"
        );
    }

    #[test]
    fn more_than_one_slash_is_refused() {
        assert_eq!(
            Keys::new(F, "a.example.com/x/y"),
            Err(PrefixError::Slashes {
                flag: F,
                value: "a.example.com/x/y".into()
            })
        );
    }

    #[test]
    fn a_prefix_that_is_not_fqdn_slash_name_is_refused() {
        for bad in [
            "localhost",
            "Example.com",
            "example..com",
            "example.com/UPPER",
            "example.com/a.b",
            "",
            "/x",
        ] {
            assert!(
                matches!(Keys::new(F, bad), Err(PrefixError::Format { .. })),
                "{bad:?} must be refused, got {:?}",
                Keys::new(F, bad)
            );
        }
    }

    #[test]
    fn a_prefix_flannel_accepts_but_the_api_server_would_refuse_is_refused_with_the_key() {
        let err = Keys::new(F, "my_domain.example.com").expect_err("underscore in the domain");
        assert!(
            matches!(&err, PrefixError::Key { key, .. } if key == "my_domain.example.com/kube-subnet-manager"),
            "{err}"
        );
        assert!(matches!(
            Keys::new(F, "example.com/_x"),
            Err(PrefixError::Key { .. })
        ));
        let long = format!("example.com/{}", "a".repeat(50));
        assert!(matches!(Keys::new(F, &long), Err(PrefixError::Key { .. })));
    }

    #[test]
    fn the_error_names_the_flag() {
        let msg = Keys::new(F, "a/b/c").expect_err("bad").to_string();
        assert!(msg.starts_with("--annotation-prefix"), "{msg}");
    }
}
