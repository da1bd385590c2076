//! The TCP proxy between the second API server and etcd that makes that server's Node watch cache lag.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// A TCP proxy to etcd that delays everything etcd sends by the current delay; what the API server sends
/// passes at once. Order is kept on each connection.
pub struct EtcdDelay {
    pub port: u16,
    delay_ms: Arc<AtomicU64>,
    accept: JoinHandle<()>,
}

impl EtcdDelay {
    pub async fn start(etcd_port: u16) -> EtcdDelay {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let port = listener.local_addr().expect("proxy address").port();
        let delay_ms = Arc::new(AtomicU64::new(0));
        let delay = delay_ms.clone();
        let accept = tokio::spawn(async move {
            while let Ok((apiserver, _)) = listener.accept().await {
                let Ok(etcd) = TcpStream::connect(("127.0.0.1", etcd_port)).await else {
                    continue;
                };
                let (mut from_apiserver, to_apiserver) = apiserver.into_split();
                let (from_etcd, mut to_etcd) = etcd.into_split();
                tokio::spawn(async move {
                    let _ = tokio::io::copy(&mut from_apiserver, &mut to_etcd).await;
                });
                tokio::spawn(delayed_copy(from_etcd, to_apiserver, delay.clone()));
            }
        });
        EtcdDelay {
            port,
            delay_ms,
            accept,
        }
    }

    pub fn set_delay(&self, delay: Duration) {
        let ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
        self.delay_ms.store(ms, Ordering::SeqCst);
    }
}

impl Drop for EtcdDelay {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// Copies `from` to `to`, each chunk held until the delay in force when it was read has passed.
async fn delayed_copy(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    delay_ms: Arc<AtomicU64>,
) {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let writer = tokio::spawn(async move {
        while let Some((due, chunk)) = rx.recv().await {
            tokio::time::sleep_until(due.into()).await;
            if to.write_all(&chunk).await.is_err() {
                return;
            }
        }
    });
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                let due = Instant::now() + Duration::from_millis(delay_ms.load(Ordering::SeqCst));
                if tx.send((due, buf[..n].to_vec())).is_err() {
                    break;
                }
            }
        }
    }
    drop(tx);
    let _ = writer.await;
}
