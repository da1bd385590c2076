//! When the API server created a Node ([`Seniority`]), the fact [`crate::overlap`] orders overlapping
//! pod CIDRs by, read only for the Nodes whose pod CIDRs overlap another's.
//!
//! The shared informer does not keep `metadata.creationTimestamp`, so the route controller reads it:
//! one metadata-only LIST of the Nodes named so (`fieldSelector=metadata.name=<name>`,
//! `resourceVersion=0`), through the controller's own client and token bucket. The API server answers a
//! list selecting one name as a read of that one key, from its watch cache, and a list needs only the
//! `list` right the Node informer has already: the DaemonSet's account may not GET a Node. Both values
//! never change for a uid, so each is read once per Node and kept until the Node is gone or re-created.
//! A cluster without overlapping pod CIDRs makes no such read; one with k Nodes in overlaps makes k, per
//! host in node mode. The startup sweep has every Node's metadata from its own listing and reads nothing
//! ([`Listed`]).

use std::collections::HashMap;
use std::sync::Arc;

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};
use netcm_node::CachedNode;

pub use crate::overlap::Seniority;

/// Why a Node's creation time could not be read.
#[derive(Debug, thiserror::Error)]
pub enum BirthError {
    /// The GET failed.
    #[error("reading node {node}: {source}")]
    Api {
        /// The Node.
        node: String,
        /// The client's error.
        #[source]
        source: kube::Error,
    },
    /// The Node is gone (its delete has not reached the cache yet).
    #[error("node {node} does not exist")]
    Gone {
        /// The Node.
        node: String,
    },
    /// The Node under that name is another one than the cache holds (deleted and created again).
    #[error("node {node} is now uid {found}, not {wanted}")]
    Replaced {
        /// The Node.
        node: String,
        /// The uid the cache holds.
        wanted: String,
        /// The uid the API server answered with.
        found: String,
    },
    /// The name cannot be put in a field selector (no valid Node name is so).
    #[error("node name {node:?} is not a DNS subdomain")]
    BadName {
        /// The Node.
        node: String,
    },
    /// The answer has no `metadata.creationTimestamp` (no API server omits it).
    #[error("node {node} has no creationTimestamp")]
    NoTimestamp {
        /// The Node.
        node: String,
    },
}

/// A source of Nodes' creation times.
pub trait Births: Send + Sync {
    /// When the API server created the Node `name` whose uid is `uid`.
    fn created<'a>(
        &'a self,
        name: &'a str,
        uid: &'a str,
    ) -> BoxFuture<'a, Result<Seniority, BirthError>>;
}

/// The Node's own metadata, as the API server answers it.
fn seniority_of(
    name: &str,
    uid: &str,
    found_uid: Option<&str>,
    created: Option<k8s_openapi::jiff::Timestamp>,
) -> Result<Seniority, BirthError> {
    let found = found_uid.unwrap_or_default();
    if found != uid {
        return Err(BirthError::Replaced {
            node: name.to_string(),
            wanted: uid.to_string(),
            found: found.to_string(),
        });
    }
    let created = created.ok_or_else(|| BirthError::NoTimestamp {
        node: name.to_string(),
    })?;
    Ok(Seniority {
        created,
        uid: uid.to_string(),
    })
}

/// Whether `name` is a DNS subdomain, as every Node name is: nothing in it can change the meaning of a
/// field selector (`,`, `=`, `!`, a backslash).
fn selectable(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
}

/// Creation times read from the API server, one metadata LIST of a single name per Node.
pub struct ApiBirths {
    api: Api<Node>,
}

impl ApiBirths {
    /// Reads through `client`.
    pub fn new(client: kube::Client) -> Self {
        Self {
            api: Api::all(client),
        }
    }
}

impl Births for ApiBirths {
    fn created<'a>(
        &'a self,
        name: &'a str,
        uid: &'a str,
    ) -> BoxFuture<'a, Result<Seniority, BirthError>> {
        Box::pin(async move {
            if !selectable(name) {
                return Err(BirthError::BadName {
                    node: name.to_string(),
                });
            }
            // The watch cache answers without a quorum read; the uid check catches an answer that is
            // behind the informer's.
            let params = ListParams::default()
                .fields(&format!("metadata.name={name}"))
                .at("0");
            let list = self
                .api
                .list_metadata(&params)
                .await
                .map_err(|source| BirthError::Api {
                    node: name.to_string(),
                    source,
                })?;
            let meta = list
                .items
                .into_iter()
                .find(|n| n.metadata.name.as_deref() == Some(name))
                .ok_or_else(|| BirthError::Gone {
                    node: name.to_string(),
                })?;
            let m = &meta.metadata;
            seniority_of(
                name,
                uid,
                m.uid.as_deref(),
                m.creation_timestamp.as_ref().map(|t| t.0),
            )
        })
    }
}

/// Creation times of Nodes listed in full, by uid.
#[derive(Debug, Default)]
pub struct Listed {
    by_uid: HashMap<String, Seniority>,
}

impl Listed {
    /// Adds the creation time of `node`, if it has one.
    pub fn add(&mut self, node: &Node) {
        let m = &node.metadata;
        if let (Some(uid), Some(created)) = (&m.uid, &m.creation_timestamp) {
            let s = Seniority {
                created: created.0,
                uid: uid.clone(),
            };
            self.by_uid.insert(uid.clone(), s);
        }
    }

    /// (name, creation) of each of `nodes` with a creation time, for
    /// [`crate::table::RouteSyncer::remember_births`].
    pub fn named<'a>(
        &'a self,
        nodes: &'a [Arc<CachedNode>],
    ) -> impl Iterator<Item = (String, Seniority)> + 'a {
        nodes.iter().filter_map(|n| {
            let s = self.by_uid.get(n.uid())?;
            Some((n.name().to_string(), s.clone()))
        })
    }
}

impl Births for Listed {
    fn created<'a>(
        &'a self,
        name: &'a str,
        uid: &'a str,
    ) -> BoxFuture<'a, Result<Seniority, BirthError>> {
        let found = self.by_uid.get(uid).cloned().ok_or(BirthError::Gone {
            node: name.to_string(),
        });
        Box::pin(std::future::ready(found))
    }
}

#[cfg(test)]
pub(crate) mod fake {
    //! Creation times the unit tests set, by uid.

    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Mutex;

    use super::*;

    /// Seconds since the epoch by uid; a switch that makes every read fail; a count of reads.
    #[derive(Default)]
    pub(crate) struct FakeBirths {
        pub(crate) born: Mutex<HashMap<String, i64>>,
        pub(crate) unreadable: AtomicBool,
        pub(crate) reads: AtomicUsize,
    }

    impl FakeBirths {
        pub(crate) fn with(born: &[(&str, i64)]) -> Self {
            let f = Self::default();
            f.born
                .lock()
                .expect("born")
                .extend(born.iter().map(|(u, t)| (u.to_string(), *t)));
            f
        }
    }

    impl Births for FakeBirths {
        fn created<'a>(
            &'a self,
            name: &'a str,
            uid: &'a str,
        ) -> BoxFuture<'a, Result<Seniority, BirthError>> {
            self.reads.fetch_add(1, Ordering::SeqCst);
            let found = if self.unreadable.load(Ordering::SeqCst) {
                Err(BirthError::Gone {
                    node: name.to_string(),
                })
            } else {
                let at = self.born.lock().expect("born").get(uid).copied();
                let created = at.and_then(|s| k8s_openapi::jiff::Timestamp::from_second(s).ok());
                seniority_of(name, uid, at.map(|_| uid), created)
            };
            Box::pin(std::future::ready(found))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

    fn listed(name: &str, uid: &str, secs: Option<i64>) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                uid: Some(uid.into()),
                creation_timestamp: secs
                    .and_then(|s| k8s_openapi::jiff::Timestamp::from_second(s).ok())
                    .map(Time),
                ..ObjectMeta::default()
            },
            ..Node::default()
        }
    }

    #[test]
    fn only_a_dns_subdomain_goes_into_a_field_selector() {
        assert!(selectable("node-1.example.com"));
        for bad in [
            "",
            "a,metadata.name=b",
            "a=b",
            "a!",
            "A",
            "a\\,b",
            &"a".repeat(254),
        ] {
            assert!(!selectable(bad), "{bad:?}");
        }
    }

    #[tokio::test]
    async fn an_answer_for_another_uid_or_without_a_timestamp_is_no_creation_time() {
        assert!(matches!(
            seniority_of("a", "uid-1", Some("uid-2"), None),
            Err(BirthError::Replaced { .. })
        ));
        assert!(matches!(
            seniority_of("a", "uid-1", Some("uid-1"), None),
            Err(BirthError::NoTimestamp { .. })
        ));
        let nodes = [listed("a", "uid-a", Some(7)), listed("b", "uid-b", None)];
        let mut l = Listed::default();
        for n in &nodes {
            l.add(n);
        }
        let a = l.created("a", "uid-a").await.expect("listed");
        assert_eq!(a.created.as_second(), 7);
        assert!(l.created("b", "uid-b").await.is_err());
        assert!(l.created("a", "uid-other").await.is_err());
        let cached: Vec<Arc<CachedNode>> = nodes.iter().map(|n| Arc::new(n.into())).collect();
        let named: Vec<(String, Seniority)> = l.named(&cached).collect();
        assert_eq!(named, [("a".to_string(), a)]);
    }
}
