package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"kvrouter/internal/enginesim"
	"kvrouter/internal/vllm"
)

// engineSimFlags are the parsed flags of "kvrouter engine-sim".
type engineSimFlags struct {
	cfg      enginesim.Config
	logLevel slog.Level
}

// listFlag collects a repeatable flag.
type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

// parseEngineSimFlags maps vllm serve's flags (and the simulator's own) to
// an enginesim.Config. getenv reads PYTHONHASHSEED and
// VLLM_ALLOW_RUNTIME_LORA_UPDATING.
func parseEngineSimFlags(args []string, getenv func(string) string, sio stdio) (*engineSimFlags, error) {
	fs := newFlagSet("engine-sim", "[flags]  (vllm serve's flag names where vLLM has them)", sio.err)
	var (
		host       = fs.String("host", "0.0.0.0", "HTTP host to listen on (vllm serve --host)")
		port       = fs.Int("port", 8000, "HTTP port; 0 picks a free one (vllm serve --port)")
		model      = fs.String("model", "", "model name, used as --served-model-name when that is empty (vllm serve --model)")
		served     = fs.String("served-model-name", "", "model id clients send and /v1/models lists (default meta-llama/Llama-3.1-8B-Instruct)")
		blockSize  = fs.Int("block-size", 0, "KV block size in tokens (default 16)")
		gpuBlocks  = fs.Int("num-gpu-blocks-override", 0, "GPU KV cache size in blocks, one of them vLLM's null block (default: the profile's, 27000)")
		cpuBlocks  = fs.Int("num-cpu-blocks", 0, "CPU offload tier in blocks; 0 disables it (events with medium CPU)")
		maxSeqs    = fs.Int("max-num-seqs", 0, "max running sequences per step (default 1024)")
		maxBatched = fs.Int("max-num-batched-tokens", 0, "token budget per step; longer prompts are chunked (default 8192)")
		maxLen     = fs.Int("max-model-len", 0, "max prompt + output tokens; longer prompts get 400 (default 131072)")
		kvEvents   = fs.String("kv-events-config", "", `KV events, vLLM's JSON, e.g. '{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://*:5557","replay_endpoint":"tcp://*:5558","topic":""}'`)
		hashAlgo   = fs.String("prefix-caching-hash-algo", "sha256", "block hash: sha256 (vLLM's default), sha256_cbor, xxhash, xxhash_cbor, or fast (XXH3-64, simulator only, not vLLM's); seeded by $PYTHONHASHSEED; when unset vLLM's algorithms take a random NONE_HASH per (re)start")
		tokPath    = fs.String("tokenizer", "", "tokenizer directory or tokenizer.json[.gz] (with tokenizer_config.json for chat templates); default: one token per UTF-8 byte")
		details    = fs.Bool("enable-prompt-tokens-details", true, "report usage.prompt_tokens_details.cached_tokens (vLLM's default is false)")
		dpRank     = fs.Int("data-parallel-rank", 0, "data-parallel rank: written in every event batch, added to the event ports")
		maxLoRAs   = fs.Int("max-loras", 1, "adapters one batch may hold, reported in vllm:lora_requests_info (vllm serve --max-loras; not enforced)")
		loraDelay  = fs.Duration("lora-load-delay", 0, "time POST /v1/load_lora_adapter takes (engine-sim only); the endpoint exists when VLLM_ALLOW_RUNTIME_LORA_UPDATING is True or 1, as in vLLM")
		dpSize     = fs.Int("data-parallel-size", 1, "data-parallel ranks behind this one endpoint (vllm serve --data-parallel-size): rank r has its own cache and publishes on the event ports + r; the X-data-parallel-rank header picks the rank, else the least loaded")
		legacy     = fs.Bool("legacy-events", false, "publish vLLM v0.22-v0.23's array event layout and the old replay replies without a topic frame")
		profile    = fs.String("profile", enginesim.ProfileH100, "timing profile: "+strings.Join(enginesim.ProfileNames(), ", "))
		overhead   = fs.Duration("step-overhead", 0, "fixed time per step (default: the profile's)")
		prefill    = fs.Float64("prefill-tokens-per-sec", 0, "prefill throughput in tokens/s (default: the profile's)")
		perSeq     = fs.Duration("decode-per-seq", 0, "time each decoding sequence adds to a step (default: the profile's)")
		cpuLoad    = fs.Float64("cpu-load-tokens-per-sec", 0, "CPU tier reload rate in tokens/s (default: the profile's)")
		defMax     = fs.Int("default-max-tokens", 0, "max_tokens of chat requests that set none (default 256; completions default to 16 as in vLLM)")
		kvBind     = fs.Bool("kv-events-bind", false, "bind the KV event PUB socket even when the --kv-events-config endpoint names a host, e.g. tcp://127.0.0.1:5557 for loopback only (engine-sim only, not a vLLM flag: vLLM binds only for *, :: addresses, ipc:// and inproc://, and connects otherwise)")
		bufBytes   = fs.Int64("kv-events-buffer-bytes", enginesim.DefaultBufferBytes, "bound of the KV event replay buffer in bytes (encoded batches + 32 B each), beside buffer_steps; the oldest batches go first (engine-sim only: vLLM bounds its buffer by buffer_steps alone)")
		queueBytes = fs.Int64("kv-events-queue-bytes", enginesim.DefaultQueueBytes, "bound in bytes of KV event batches waiting to be sent (token ids 4 B, hashes 8 B); beyond it batches are dropped before getting a seq, as beyond max_queue_size (engine-sim only)")
		kvTransfer = fs.String("kv-transfer-config", "", `disaggregated prefill/decode, vLLM's JSON: '{"kv_connector":"NixlConnector","kv_role":"kv_producer"}' (prefill; kv_consumer: decode; kv_both)`)
		kvLink     = fs.String("kv-link", "infiniband", "link the decode role pulls KV over: nvlink (450 GB/s), infiniband (50), roce (25), tcp (1) (engine-sim only)")
		kvLinkGBps = fs.Float64("kv-link-gbps", 0, "measured link bandwidth in GB/s, overriding --kv-link (engine-sim only)")
		kvShape    = fs.String("kv-model-shape", "32,8,128,2", "model KV shape layers,kv_heads,head_dim,dtype_bytes for the KV bytes per token (default Llama-3.1-8B bf16: 128 KiB; engine-sim only)")
		vocab      = fs.Int("vocab-size", 0, "token ids must be below this (default 128256, or 262144 with --tokenizer)")
		shutdown   = fs.Int("shutdown-timeout", 0, "seconds to drain on SIGTERM or SIGINT (vllm serve --shutdown-timeout): new connections refused, new requests 503, requests in flight finish, the rest aborted after this; 0 (vLLM's default) aborts them at once")
		f          enginesim.Faults
		loras      listFlag
		logLevel   slog.Level
	)
	fs.Var(&loras, "lora-modules", "LoRA adapter served as a model id, name or name=path (repeatable; vllm serve --lora-modules)")
	fs.Float64Var(&f.ErrorRate, "fault-error-rate", 0, "fraction of requests answered with --fault-error-status")
	fs.IntVar(&f.ErrorStatus, "fault-error-status", 500, "HTTP status of injected errors")
	fs.Float64Var(&f.SpikeRate, "fault-spike-rate", 0, "fraction of requests delayed by --fault-spike-delay before the engine")
	fs.DurationVar(&f.SpikeDelay, "fault-spike-delay", time.Second, "latency spike duration")
	fs.Float64Var(&f.DieRate, "fault-die-rate", 0, "fraction of streams cut (no [DONE]) after --fault-die-after-tokens tokens")
	fs.IntVar(&f.DieAfterTokens, "fault-die-after-tokens", 1, "tokens sent before a dying stream is cut")
	fs.Float64Var(&f.HangRate, "fault-hang-rate", 0, "fraction of requests that hang before the first byte until the client leaves")
	fs.DurationVar(&f.SlowStart, "fault-slow-start", 0, "cold-replica period after start and restart, steps slower by up to --fault-slow-start-factor")
	fs.Float64Var(&f.SlowStartFactor, "fault-slow-start-factor", 4, "step-time multiplier at start, falling linearly to 1")
	fs.IntVar(&f.DropEveryKBatches, "fault-drop-every-k-batches", 0, "drop every k-th KV event batch on the wire (kept for replay, like an HWM drop)")
	fs.Uint64Var(&f.Seed, "fault-seed", 1, "seed of the fault dice")
	fs.TextVar(&logLevel, "log-level", slog.LevelInfo, "log level: debug, info, warn, error")
	fs.Usage = func() {
		fmt.Fprintf(sio.err, "usage: kvrouter engine-sim [flags]\n\n"+
			"A simulated vLLM engine: OpenAI API, prefix cache with vLLM's KV events over ZeroMQ,\n"+
			"continuous-batching timing model, faults. POST /admin/restart or SIGHUP restarts the\n"+
			"engine (empty cache; the KV event sockets close and reopen on the same endpoints, empty\n"+
			"replay buffer, event seq from 0); POST /admin/stall-events?duration=5s stalls\n"+
			"the publisher; POST /admin/freeze?duration=30s hangs the engine core (HTTP keeps\n"+
			"answering /health and /metrics, frozen; 0s thaws); POST /reset_prefix_cache clears\n"+
			"the cache (AllBlocksCleared).\n"+
			"PYTHONHASHSEED in the environment seeds the block hashes, as for vLLM.\n\nflags:\n")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args); err != nil {
		return nil, err
	}

	var errs []error
	if *shutdown < 0 {
		errs = append(errs, fmt.Errorf("--shutdown-timeout %d: want seconds >= 0", *shutdown))
	}
	if *port < 0 || *port > 65535 {
		errs = append(errs, fmt.Errorf("--port %d: want 0..65535 (0 picks a free one)", *port))
	}
	kv, err := enginesim.ParseKVEventsConfig(*kvEvents)
	errs = append(errs, err)
	kv.Bind = *kvBind
	kv.BufferBytes, kv.QueueBytes = *bufBytes, *queueBytes
	if *bufBytes <= 0 || *queueBytes <= 0 {
		errs = append(errs, fmt.Errorf("--kv-events-buffer-bytes %d, --kv-events-queue-bytes %d: want positive byte counts", *bufBytes, *queueBytes))
	}
	pdc, err := enginesim.ParseKVTransferConfig(*kvTransfer)
	errs = append(errs, err)
	pdc.Link, pdc.LinkGBps = *kvLink, *kvLinkGBps
	pdc.Model, err = enginesim.ParseShape(*kvShape)
	errs = append(errs, err)
	if pdc.Role == "" {
		pdc = enginesim.PDConfig{}
	}
	cfg := enginesim.Config{
		PD: pdc,
		Core: enginesim.CoreConfig{
			BlockSize: *blockSize, NumGPUBlocks: *gpuBlocks, NumCPUBlocks: *cpuBlocks, MaxNumSeqs: *maxSeqs,
			MaxNumBatchedTokens: *maxBatched, MaxModelLen: *maxLen, Profile: *profile, VocabSize: *vocab,
			Timing: enginesim.Timing{StepOverhead: *overhead, PrefillTokensPerSec: *prefill, DecodePerSeq: *perSeq, CPULoadTokensPerSec: *cpuLoad},
		},
		Addr:                  net.JoinHostPort(*host, strconv.Itoa(*port)),
		ServedModelName:       *served,
		DefaultMaxTokens:      *defMax,
		HashAlgo:              *hashAlgo,
		KVEvents:              kv,
		LegacyEvents:          *legacy,
		DataParallelRank:      *dpRank,
		DataParallelSize:      *dpSize,
		NoPromptTokensDetails: !*details,
		Faults:                f,
		ShutdownTimeout:       time.Duration(*shutdown) * time.Second,
	}
	if cfg.ServedModelName == "" {
		cfg.ServedModelName = *model
	}
	for _, l := range loras {
		name, _, _ := strings.Cut(l, "=")
		cfg.LoRAModules = append(cfg.LoRAModules, name)
	}
	switch strings.ToLower(getenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING")) {
	case "1", "true":
		cfg.AllowRuntimeLoRA = true
	}
	switch strings.ToLower(getenv("VLLM_ENABLE_RESPONSES_API_STORE")) {
	case "1", "true":
		cfg.ResponsesStore = true // /v1/responses keeps stored responses, as vLLM with it
	}
	cfg.MaxLoRAs, cfg.LoRALoadDelay = *maxLoRAs, *loraDelay
	seed := getenv("PYTHONHASHSEED")
	if *hashAlgo == "fast" {
		cfg.NewHasher = func() (enginesim.BlockHasher, error) { return enginesim.NewFastHasher(seed), nil }
	} else if algo, err := vllm.ParseHashAlgo(*hashAlgo); err != nil {
		errs = append(errs, fmt.Errorf("--prefix-caching-hash-algo %q: want sha256, sha256_cbor, xxhash, xxhash_cbor or fast", *hashAlgo))
	} else {
		cfg.NewHasher = func() (enginesim.BlockHasher, error) { return vllm.NewBlockHasher(algo, seed, nil) }
	}
	if *tokPath != "" {
		tok, err := enginesim.LoadTokenizer(*tokPath)
		errs = append(errs, err)
		cfg.Tokenizer = tok
		if cfg.Core.VocabSize == 0 {
			cfg.Core.VocabSize = 262144
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("%w: %v", errUsage, err)
	}
	return &engineSimFlags{cfg: cfg, logLevel: logLevel}, nil
}

// runEngineSim implements "kvrouter engine-sim": it serves until ctx ends;
// SIGHUP restarts the simulated engine.
func runEngineSim(ctx context.Context, args []string, sio stdio) error {
	fl, err := parseEngineSimFlags(args, os.Getenv, sio)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(sio.err, &slog.HandlerOptions{Level: fl.logLevel}))
	srv, err := enginesim.New(fl.cfg, log, prometheus.NewRegistry())
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	return srv.RunRestarting(ctx, hup)
}
