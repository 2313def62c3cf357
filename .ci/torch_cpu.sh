# Sourced by the CI scripts. CPU-only torch: PyTorch's CPU wheel index serves torch and torchvision without the
# CUDA libraries (about 3 GB less in every environment, none of it loaded on a CPU machine). Where that index
# cannot be reached, nothing is installed here and pip takes torch from its default index with the rest, as the
# README's commands do.
TORCH_CPU_INDEX="${TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}"

torch_cpu() {  # torch_cpu PIP [PIP_ARGS...]: torch and torchvision from the CPU index into PIP's environment
  local pip="$1"
  shift
  if python3 -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1].rstrip('/') + '/torch/', timeout=10)" \
      "$TORCH_CPU_INDEX" 2>/dev/null; then
    "$pip" install -q --index-url "$TORCH_CPU_INDEX" "$@" torch torchvision \
      || echo "CPU-only torch: not installed from $TORCH_CPU_INDEX; torch comes from the default index"
  else
    echo "CPU-only torch: $TORCH_CPU_INDEX cannot be reached; torch comes from the default index"
  fi
}
