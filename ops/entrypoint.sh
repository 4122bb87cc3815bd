#!/usr/bin/env bash
# The images' entry point: one role per container (docker run IMAGE ROLE [options]).
#
#   serve [options]          autospec serve --host 0.0.0.0 [options]: the serving application
#                            on a Ray started in the container (blocks); port 8000
#   controller [options]     autospec controller run --policy $AUTOSPEC_POLICY (default: the
#                            shipped default policy) [options]
#   db-upgrade [options]     autospec db upgrade [options]: migrate the schema, then exit
#   wait-for-schema          wait until `autospec db current` exits 0 (this image's code can
#                            run against the schema); init containers run this
#   fetch-model              download the target once: the Hugging Face repository
#                            $AUTOSPEC_MODEL_REPO at $AUTOSPEC_MODEL_REVISION (default main)
#                            into $AUTOSPEC_MODEL_DIR (default /models/target); nothing is
#                            done when a complete copy is there (HF_TOKEN for gated models)
#   help                     this text
#   anything else            run as given (ray start ..., autospec ..., bash): KubeRay and the
#                            cluster launcher start their Ray processes this way
#
# Every role reads the AUTOSPEC_* environment (AUTOSPEC_DATABASE_URL, AUTOSPEC_API_KEY,
# AUTOSPEC_DATA_DIR, AUTOSPEC_ARTIFACT_DIR; autospec/settings.py).
set -euo pipefail

role=${1:-help}
[ $# -eq 0 ] || shift

case $role in
  serve)
    exec autospec serve --host 0.0.0.0 "$@"
    ;;
  controller)
    exec autospec controller run --policy "${AUTOSPEC_POLICY:-default}" "$@"
    ;;
  db-upgrade)
    exec autospec db upgrade "$@"
    ;;
  wait-for-schema)
    # exit 0: current or ahead-compatible (this code runs against it); 1: empty, older, or
    # newer by a contracting migration; 2: the database is unreachable
    until autospec db current; do
      echo "waiting for the schema: run the migration Job (autospec db upgrade)" >&2
      sleep "${AUTOSPEC_WAIT_S:-5}"
    done
    ;;
  fetch-model)
    dir=${AUTOSPEC_MODEL_DIR:-/models/target}
    if [ -e "$dir/.autospec-complete" ]; then
      echo "$dir: the target is there"
      exit 0
    fi
    : "${AUTOSPEC_MODEL_REPO:?set AUTOSPEC_MODEL_REPO to the Hugging Face repository of the target}"
    rm -rf "$dir.partial"
    python - "$AUTOSPEC_MODEL_REPO" "${AUTOSPEC_MODEL_REVISION:-main}" "$dir.partial" <<'PY'
import sys

from huggingface_hub import snapshot_download

repo, revision, out = sys.argv[1:]
# the weights (safetensors), configs and tokenizer files; not the original/*.pth duplicates
snapshot_download(repo_id=repo, revision=revision, local_dir=out,
                  allow_patterns=["*.json", "*.safetensors", "*.model", "*.tiktoken",
                                  "*.txt", "*.jinja"])
PY
    rm -rf "$dir"
    mv "$dir.partial" "$dir"
    echo "$AUTOSPEC_MODEL_REPO@${AUTOSPEC_MODEL_REVISION:-main}" > "$dir/.autospec-complete"
    echo "$dir: downloaded $AUTOSPEC_MODEL_REPO"
    ;;
  help | --help | -h)
    sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'
    ;;
  *)
    exec "$role" "$@"
    ;;
esac
