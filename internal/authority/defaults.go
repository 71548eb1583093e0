package authority

// DefaultRegisterEvery is how often the authority re-registers with
// discovery when discovery.register_every is not set (what --check-config
// prints as in force).
const DefaultRegisterEvery = defaultRegisterEvery
