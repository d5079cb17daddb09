"""Gemma 4's audio input: a clip of speech in, soft tokens in the text model's width out, by E2B's and E4B's
audio encoder (a Conformer over log-mel rows) or by the 12B's frames projection (raw frames, no encoder).

Like the image encoder (pyapp.families.gemma4_vision), not a model of its own: it belongs to a Gemma 4
text model, inline in Ollama's original blobs (`a.*`, `mm.a.*`, `gemma4.audio.*` keys) or in a
projector file beside it (llama.cpp's mmproj, `clip.audio.*` keys), and its soft tokens go where the
prompt holds the clip's placeholder run (`<|audio>` + N x `<|audio|>` + `<audio|>`).

    wav.py          read_wav: a WAV file's samples, 16 kHz mono float32 (standard library)
    resample.py     resample: windowed-sinc rate conversion (standard library)
    features.py     log_mel: 128 log-mel values per 10 ms, as transformers' feature extractor (standard library)
    config.py       AudioConfig: the hyperparameters, from gemma4.audio.* or clip.audio.* keys; FrameProjectionConfig
    weights.py      its tensors, bound once (Ollama's names and llama.cpp's differ: one rename table)
    reference.py    AudioEncoder: the numpy oracle, features -> soft tokens (CPython only); FrameProjection the 12B's
    encoder.py      AudioEncoder on the GPU: log-mel rows -> soft tokens; encoder_class: which of the two a file holds
    frames.py       the 12B's features: raw frames of 640 samples, as transformers' unified extractor (stdlib)
    projection.py   FrameProjectionEncoder: the 12B's audio input on the GPU (llama.cpp's gemma4ua)
    source.py       find_audio_encoder: inline, a projector given, an Ollama projector layer
"""
