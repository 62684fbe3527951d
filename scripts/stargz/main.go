// containerd-stargz-grpc for pinboard's lab: the stargz snapshotter Debian packages as Go source
// (golang-github-containerd-stargz-snapshotter-dev 0.12.0), served as a containerd proxy plugin on a unix
// socket. Modelled on upstream's cmd/containerd-stargz-grpc (v0.12.0), keeping only what the lab needs:
// a root directory, a socket and a config file. Credentials come, as upstream's do, from the docker config
// ($DOCKER_CONFIG, else ~/.docker) and, with `[cri_keychain] enable_keychain = true`, from the CRI
// PullImage requests sent to this socket (forwarded to `image_service_path`, containerd's CRI socket).
// Left out: the kubeconfig keychain, IPFS, the bolt metadata store, metrics and sd_notify.
//
// SIGINT unmounts every layer before exiting; SIGTERM exits leaving them mounted, as upstream does.
// scripts/setup builds it in GOPATH mode; see docs/lab.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"time"

	snapshotsapi "github.com/containerd/containerd/api/services/snapshots/v1"
	"github.com/containerd/containerd/contrib/snapshotservice"
	"github.com/containerd/containerd/log"
	"github.com/containerd/containerd/pkg/dialer"
	"github.com/containerd/containerd/snapshots"
	"github.com/containerd/stargz-snapshotter/service"
	"github.com/containerd/stargz-snapshotter/service/keychain/cri"
	"github.com/containerd/stargz-snapshotter/service/keychain/dockerconfig"
	"github.com/containerd/stargz-snapshotter/service/resolver"
	"github.com/pelletier/go-toml"
	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1alpha2"
)

var (
	address    = flag.String("address", "/run/containerd-stargz-grpc/containerd-stargz-grpc.sock", "socket to serve on")
	configPath = flag.String("config", "/etc/containerd-stargz-grpc/config.toml", "config file (absent: defaults)")
	rootDir    = flag.String("root", "/var/lib/containerd-stargz-grpc", "where layers, caches and snapshots live")
	logLevel   = flag.String("log-level", "info", "logrus level")
)

func main() {
	flag.Parse()
	level, err := logrus.ParseLevel(*logLevel)
	if err != nil {
		log.L.WithError(err).Fatal("invalid -log-level")
	}
	logrus.SetLevel(level)
	ctx := log.WithLogger(context.Background(), log.L)

	var config service.Config
	if tree, err := toml.LoadFile(*configPath); err == nil {
		if err := tree.Unmarshal(&config); err != nil {
			log.G(ctx).WithError(err).Fatalf("cannot read %s", *configPath)
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		log.G(ctx).WithError(err).Fatalf("cannot read %s", *configPath)
	}

	rpc := grpc.NewServer()
	creds := []resolver.Credential{dockerconfig.NewDockerconfigKeychain(ctx)}
	if config.CRIKeychainConfig.EnableKeychain {
		backend := config.CRIKeychainConfig.ImageServicePath
		if backend == "" {
			log.G(ctx).Fatal("cri_keychain: image_service_path (containerd's CRI socket) is not set")
		}
		keychain, proxy := cri.NewCRIKeychain(ctx, func() (runtime.ImageServiceClient, error) {
			return connectCRI(backend)
		})
		runtime.RegisterImageServiceServer(rpc, proxy)
		creds = append(creds, keychain)
	}

	sn, err := service.NewStargzSnapshotterService(ctx, *rootDir, &config, service.WithCredsFuncs(creds...))
	if err != nil {
		log.G(ctx).WithError(err).Fatal("cannot start the snapshotter")
	}
	cleanup, err := serve(ctx, rpc, *address, sn)
	if err != nil {
		log.G(ctx).WithError(err).Fatal("serving failed")
	}
	if cleanup {
		log.G(ctx).Info("unmounting every layer")
		if err := sn.Close(); err != nil {
			log.G(ctx).WithError(err).Fatal("cleanup failed")
		}
	}
	log.G(ctx).Info("exiting")
}

// connectCRI dials the CRI image service the keychain forwards to.
func connectCRI(address string) (runtime.ImageServiceClient, error) {
	retry := backoff.DefaultConfig
	retry.MaxDelay = 3 * time.Second
	conn, err := grpc.Dial(dialer.DialAddress(address),
		grpc.WithInsecure(),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: retry}),
		grpc.WithContextDialer(dialer.ContextDialer))
	if err != nil {
		return nil, err
	}
	return runtime.NewImageServiceClient(conn), nil
}

// serve registers the snapshotter on rpc and serves it on the unix socket addr until SIGINT (true:
// unmount everything) or SIGTERM (false).
func serve(ctx context.Context, rpc *grpc.Server, addr string, sn snapshots.Snapshotter) (bool, error) {
	snapshotsapi.RegisterSnapshotsServer(rpc, snapshotservice.FromSnapshotter(sn))
	if err := os.MkdirAll(filepath.Dir(addr), 0o700); err != nil {
		return false, err
	}
	// A socket left by a killed run would make Listen fail with EADDRINUSE.
	if err := os.RemoveAll(addr); err != nil {
		return false, err
	}
	listener, err := net.Listen("unix", addr)
	if err != nil {
		return false, fmt.Errorf("listening on %s: %w", addr, err)
	}
	failed := make(chan error, 1)
	go func() { failed <- rpc.Serve(listener) }()
	log.G(ctx).WithField("address", addr).Info("serving")

	signals := make(chan os.Signal, 1)
	signal.Notify(signals, unix.SIGINT, unix.SIGTERM)
	select {
	case s := <-signals:
		log.G(ctx).Infof("got %v", s)
		return s == unix.SIGINT, nil
	case err := <-failed:
		return false, fmt.Errorf("serving %s: %w", addr, err)
	}
}
