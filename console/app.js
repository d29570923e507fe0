document.getElementById("app").textContent = "ctx console";
