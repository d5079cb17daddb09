"""Gemma 4's image encoder: a picture in, soft tokens in the text model's width out.

Not a model of its own (no architecture a file is read as): it belongs to a Gemma 4 text model, inline
in Ollama's original blobs or in a projector file beside it (llama.cpp's mmproj, Ollama's projector
layer), and its soft tokens go where the prompt holds the image's placeholder run.

    config.py       VisionConfig: the hyperparameters, from gemma4.vision.* or clip.vision.* keys; the 12B's
                    PatchProjectionConfig; encoder_config(gguf): the kind the file holds
    weights.py      its tensors, bound once (the same names in both forms; clamp bounds two ways)
    encoder.py      ImageEncoder: the GPU forward, pixels -> soft tokens (pyapp/families/gemma4_vision/reference.py: its oracle)
    projection.py   PatchProjectionEncoder: the 12B's encoder-free patch projection (gemma4uv), the same way
    gpu_encoder.py  what the two share: loading (steps), the weights' upload, encoding an image's pixels
"""
