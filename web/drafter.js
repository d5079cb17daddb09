// An assistant drafter beside the chosen model (issue 29 goal 4): Google's gemma-4-…-it-assistant, converted by
// llama.cpp, added from a file. The worker checks it was made for this model and keeps it on the GPU beside the
// model (loaded with it, or at once when the model is loaded); greedy replies with Speculative drafts above 0
// then draft with it (prompt lookup still where the text repeats). It is made for one model: choosing another
// forgets it.

const $ = (id) => document.getElementById(id);

// app: what this uses of app.js: {call, state, showError, updateButtons}
export function setupDrafter(app) {
  const { call, state, showError, updateButtons } = app;
  const dr = { info: null };   // {name, loaded, drafts} of the drafter added (pyapp.webapp._drafter), or null
  state.drafter = dr;          // for tests and the curious

  function render() {
    const gen = state.streaming !== null;
    $("drafter-box").hidden = !state.model || !!state.model.denoise;
    const name = dr.info && dr.info.name;
    $("drafter-info").textContent = !name ? "" : dr.info.loaded
      ? `Greedy replies draft with \u201c${name}\u201d (Speculative drafts, under Advanced sampling).`
      : `\u201c${name}\u201d drafts once the model is loaded.`;
    $("remove-drafter").hidden = !name;
    for (const id of ["open-drafter", "drafter-input", "remove-drafter"]) $(id).disabled = gen || state.busy;
  }
  // Drafts do nothing while Speculative drafts is 0: a drafter added turns them on at its suggestion.
  function suggestDrafts(n) {
    const field = $("speculate");
    if (Number(field.value) > 0) return;
    field.value = String(n);
    field.dispatchEvent(new Event("change", { bubbles: true }));
  }
  async function addDrafter(file) {
    if (!file || state.busy || state.streaming !== null) return;
    showError("drafter-error", "");
    state.busy = true;            // nothing is sent while the drafter loads beside the model
    updateButtons();
    $("drafter-info").textContent = `Loading \u201c${file.name}\u201d…`;
    const r = await call("add_drafter", file, file.name);
    state.busy = false;
    if (r.drafter) {               // added (with an error too: it waits to load with the model, which says why)
      dr.info = r.drafter;
      suggestDrafts(r.drafter.drafts);
    }
    updateButtons();              // renders this box too
    if (r.error) showError("drafter-error", r);
  }
  $("open-drafter").onclick = () => $("drafter-input").click();
  $("drafter-input").onchange = (ev) => { addDrafter(ev.target.files[0]); ev.target.value = ""; };
  $("remove-drafter").onclick = async () => {
    if (state.busy || state.streaming !== null) return;
    const r = await call("remove_drafter");
    dr.info = r.drafter && r.drafter.name ? r.drafter : null;
    showError("drafter-error", "");
    render();
    $("open-drafter").focus();      // the button pressed is gone
  };

  return {
    render,
    add: addDrafter,
    modelChosen() { dr.info = null; showError("drafter-error", ""); render(); },     // made for the old model
    modelLoaded(info) { dr.info = info && info.name ? info : null; render(); },
    modelUnloaded() { if (dr.info) dr.info = { ...dr.info, loaded: false }; render(); },   // it loads with the model
  };
}
